//! The systemd units in `examples/systemd/` are valid for systemd (checked
//! by `systemd-analyze verify`, with the real binaries in place of
//! `/usr/local/bin`) and keep their hardening. Their command lines are
//! checked against the CLIs by unit tests in `agent/src/main.rs` and
//! `cli/src/main.rs`.

use std::os::unix::fs::PermissionsExt;
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
    let _serial = nightshift_tests::serial::module(module_path!());
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
    // Issue 46 point 11: root, but with one capability and a syscall filter.
    for (k, v) in [
        ("CapabilityBoundingSet", "CAP_SYS_ADMIN"),
        ("SystemCallFilter", "@system-service"),
        ("SystemCallErrorNumber", "EPERM"),
        ("ProtectKernelLogs", "yes"),
        ("PrivateMounts", "yes"),
    ] {
        assert!(agent.iter().any(|(a, b)| a == k && b == v), "the agent unit lost {k}={v}");
    }
    let denied = agent.iter().find(|(k, v)| k == "SystemCallFilter" && v.starts_with('~')).map(|(_, v)| v.clone());
    for group in ["@mount", "@reboot", "@module", "@raw-io", "@debug", "@swap", "@clock"] {
        assert!(denied.as_deref().is_some_and(|d| d.split_whitespace().any(|g| g.trim_start_matches('~') == group)));
    }
}

/// `systemd-analyze security` scores both units (lower is safer; 10 is no
/// sandbox at all): the agent, root for its hardware, at most 3.0 (4.8
/// before round 4's capabilities and syscall filter); the engine at most
/// 1.5. `--threshold` makes systemd itself fail the check.
#[test]
fn systemd_scores_the_units_exposure() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(analyze) = require("systemd-analyze", "systemd") else { return };
    let dir = tempfile::tempdir().unwrap();
    // systemd's threshold is in tenths of the printed score.
    for (name, most_tenths) in [("nightshift-agent.service", 30), ("nightshift-engine.service", 15)] {
        let path = dir.path().join(name);
        std::fs::write(&path, unit(name)).unwrap();
        let out = Command::new(&analyze)
            .args(["security", "--offline=true", "--no-pager", &format!("--threshold={most_tenths}")])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let score = text.lines().find(|l| l.contains("Overall exposure level")).unwrap_or("").to_string();
        println!("{score}");
        assert!(out.status.success(), "{name}: expected exposure at most {most_tenths} tenths, found: {score}\n{text}");
    }
}

#[test]
fn systemd_accepts_the_units() {
    let _serial = nightshift_tests::serial::module(module_path!());
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

/// `scripts/package-deb` builds both Debian packages from the workspace's
/// binaries: `dpkg-deb --info` names them, their contents hold the binary,
/// the unit (valid for systemd with the packaged paths), and for the engine
/// the shipped runbooks it loads; the maintainer scripts parse, make the
/// engine's user, and enable nothing.
#[test]
fn debian_packages_hold_what_they_say() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(dpkg_deb) = require("dpkg-deb", "dpkg") else { return };
    let bins = workspace_bin_dir();
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/package-deb"))
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--out")
        .arg(dir.path())
        .arg("--fast")
        .output()
        .unwrap();
    assert!(out.status.success(), "package-deb: {}", String::from_utf8_lossy(&out.stderr));
    let debs: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(debs.len(), 2, "{debs:?}");
    let version = env!("CARGO_PKG_VERSION");
    for (pkg, bin, unit_name, depends) in [
        ("nightshift-agent", "nightshift-agent", "nightshift-agent.service", "libc6"),
        ("nightshift", "nightshift", "nightshift-engine.service", "libc6, adduser"),
    ] {
        let deb = debs.iter().find(|d| d.contains(&format!("/{pkg}_"))).unwrap_or_else(|| panic!("{pkg}: {debs:?}"));
        let info = Command::new(&dpkg_deb).args(["--info", deb]).output().unwrap();
        let info = String::from_utf8_lossy(&info.stdout).to_string();
        println!("dpkg-deb --info {deb}\n{info}");
        for want in [
            format!("Package: {pkg}\n"),
            format!("Version: {version}\n"),
            format!("Depends: {depends}\n"),
            "postinst".into(),
            "prerm".into(),
        ] {
            assert!(info.contains(&want), "{pkg}: expected {want:?} in:\n{info}");
        }
        let x = dir.path().join(pkg);
        for (flag, to) in [("-x", x.clone()), ("-e", x.join("DEBIAN"))] {
            let st = Command::new(&dpkg_deb).arg(flag).arg(deb).arg(&to).status().unwrap();
            assert!(st.success(), "dpkg-deb {flag} {deb}");
        }
        // The packaged binary runs.
        let v = Command::new(x.join("usr/bin").join(bin)).arg("--version").output().unwrap();
        assert!(v.status.success() && String::from_utf8_lossy(&v.stdout).contains(version), "{pkg} --version: {v:?}");
        // The unit points at the packaged binary; systemd accepts it.
        let unit_path = x.join("lib/systemd/system").join(unit_name);
        let unit = std::fs::read_to_string(&unit_path).unwrap();
        assert!(unit.contains(&format!("ExecStart=/usr/bin/{bin} ")), "{unit}");
        assert!(!unit.contains("/usr/local/"), "{unit}");
        if let Some(analyze) = require("systemd-analyze", "systemd") {
            let local = dir.path().join(format!("check-{unit_name}"));
            std::fs::create_dir_all(&local).unwrap();
            let local = local.join(unit_name);
            std::fs::write(&local, unit.replace("/usr/bin/", &format!("{}/", x.join("usr/bin").display()))).unwrap();
            let o = Command::new(&analyze).args(["verify", "--man=no"]).arg(&local).current_dir("/").output().unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr);
            let findings: Vec<&str> = stderr.lines().filter(|l| l.contains(unit_name)).collect();
            assert!(o.status.success() && findings.is_empty(), "systemd-analyze verify {unit_name}:\n{stderr}");
        }
        // Maintainer scripts parse, and none enables or starts the unit.
        for script in ["postinst", "prerm", "postrm"] {
            let path = x.join("DEBIAN").join(script);
            let st = Command::new("sh").arg("-n").arg(&path).status().unwrap();
            assert!(st.success(), "{pkg} {script} does not parse");
            let text = std::fs::read_to_string(&path).unwrap();
            let commands: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with("echo")).collect();
            assert!(
                !commands.iter().any(|l| l.contains("systemctl enable") || l.contains("systemctl start")),
                "{pkg} {script} enables and starts nothing: {text}"
            );
        }
    }
    // The engine's package carries the runbooks its units load — conffiles
    // in the one runbook_dir its sample engine.yaml names — and makes its user.
    let engine = dir.path().join("nightshift");
    let v = Command::new(engine.join("usr/bin/nightshift"))
        .args(["runbooks", "validate"])
        .arg(engine.join("etc/nightshift/runbooks"))
        .output()
        .unwrap();
    assert!(v.status.success(), "the packaged runbooks validate: {v:?}");
    assert!(!engine.join("usr/share/nightshift/runbooks").exists(), "one runbook_dir");
    let sample = std::fs::read_to_string(engine.join("usr/share/doc/nightshift/examples/engine.yaml")).unwrap();
    assert!(sample.contains("\nrunbook_dir: /etc/nightshift/runbooks\n"), "{sample}");
    // Issue 43 point 8: conffiles (kept across upgrades when edited), the
    // chain checker, sample configs that pass check-config.
    let conffiles = std::fs::read_to_string(engine.join("DEBIAN/conffiles")).unwrap();
    assert!(conffiles.lines().any(|l| l == "/etc/nightshift/runbooks/gpu-overheat.rhai"), "{conffiles}");
    assert!(conffiles.lines().all(|l| l.starts_with("/etc/nightshift/")), "{conffiles}");
    let agent_x = dir.path().join("nightshift-agent");
    let agent_conffiles = std::fs::read_to_string(agent_x.join("DEBIAN/conffiles")).unwrap();
    assert_eq!(agent_conffiles, "/etc/nightshift/policy.yaml\n");
    let checker = engine.join("usr/share/nightshift/verify-chain.py");
    assert!(std::fs::metadata(&checker).unwrap().permissions().mode() & 0o111 != 0, "verify-chain.py runs");
    if let Some(py) = require("python3", "python3") {
        let o = Command::new(py).arg(&checker).arg("--help").output().unwrap();
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage: verify-chain.py") || o.status.success(), "{o:?}");
    }
    // The agent's sample, installed as the postinst says (its paths moved
    // under a scratch root: /etc/nightshift and /var/lib), passes
    // check-config with the packaged policy.
    let node_root = dir.path().join("node");
    std::fs::create_dir_all(node_root.join("etc/nightshift")).unwrap();
    std::fs::create_dir_all(node_root.join("var/lib/nightshift-agent")).unwrap();
    std::fs::copy(agent_x.join("etc/nightshift/policy.yaml"), node_root.join("etc/nightshift/policy.yaml")).unwrap();
    std::fs::write(node_root.join("etc/nightshift/authorized_keys"), "").unwrap();
    std::fs::write(node_root.join("etc/nccl.conf"), "NCCL_DEBUG=WARN\n").unwrap();
    let sample = std::fs::read_to_string(agent_x.join("usr/share/doc/nightshift-agent/examples/agent.yaml")).unwrap();
    let r = node_root.display().to_string();
    let sample = sample
        .replace(" /etc/", &format!(" {r}/etc/"))
        .replace(" /var/lib/", &format!(" {r}/var/lib/"))
        .replace("kind: slurm", "kind: none");
    let policy = std::fs::read_to_string(node_root.join("etc/nightshift/policy.yaml")).unwrap();
    std::fs::write(
        node_root.join("etc/nightshift/policy.yaml"),
        policy.replace("/etc/nightshift/hands-off", &format!("{r}/etc/nightshift/hands-off")),
    )
    .unwrap();
    let cfg = node_root.join("etc/nightshift/agent.yaml");
    std::fs::write(&cfg, sample).unwrap();
    let o = Command::new(agent_x.join("usr/bin/nightshift-agent"))
        .args(["check-config", "--live", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "the packaged sample passes check-config: {o:?}");
    let postinst = std::fs::read_to_string(engine.join("DEBIAN/postinst")).unwrap();
    // Issue 46 point 11: /etc/nightshift (tokens, the database URL, the
    // peer token) is made 0750, for the engine's group only.
    assert!(postinst.contains("install -d -m 0750 -o root -g nightshift /etc/nightshift"), "{postinst}");
    let agent_postinst = std::fs::read_to_string(dir.path().join("nightshift-agent/DEBIAN/postinst")).unwrap();
    assert!(agent_postinst.contains("install -d -m 0750 -o root -g root /etc/nightshift"), "{agent_postinst}");
    assert!(
        !format!("{postinst}{agent_postinst}").contains("mkdir -p /etc/nightshift"),
        "no dir made with the umask's mode"
    );
    assert!(postinst.contains("adduser --system --ingroup nightshift"), "{postinst}");
}

/// `examples/ansible/agents.yml` passes `ansible-playbook --syntax-check`,
/// and the agent.yaml its template writes (rendered here by Ansible's own
/// template module) is a config `nightshift-agent check-config` accepts.
#[test]
fn the_ansible_playbook_parses_and_writes_a_valid_agent_config() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(playbook) = require("ansible-playbook", "ansible-core") else { return };
    let Some(ansible) = require("ansible", "ansible-core") else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ansible");
    let o = Command::new(&playbook)
        .args(["--syntax-check", "-i"])
        .arg(root.join("inventory.ini"))
        .arg(root.join("agents.yml"))
        .env("ANSIBLE_LOCALHOST_WARNING", "false")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ansible-playbook --syntax-check:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::copy(root.join("../policy.yaml"), dir.path().join("policy.yaml")).unwrap();
    let bins = workspace_bin_dir();
    let agent = bins.join("nightshift-agent");
    let k = Command::new(&agent).args(["keygen", "--out"]).arg(dir.path().join("engine_key")).output().unwrap();
    assert!(k.status.success(), "{k:?}");
    std::fs::copy(dir.path().join("engine_key.pub"), dir.path().join("authorized_keys")).unwrap();
    std::fs::write(dir.path().join("nccl.conf"), "").unwrap();
    let dest = dir.path().join("agent.yaml");
    let vars = [
        "nightshift_node_name=gpu-a01".to_string(),
        "nightshift_listen_addr=127.0.0.1:2222".into(),
        format!("nightshift_state_dir={d}/state"),
        format!("nightshift_config_dir={d}"),
        format!("nightshift_drop_caches_path={d}/drop_caches"),
        format!("nightshift_nccl_conf={d}/nccl.conf"),
        "nightshift_backend=sim".into(),
        "nightshift_exporter_listen_addr=127.0.0.1:9400".into(),
        "nightshift_scheduler=none".into(),
    ];
    let mut cmd = Command::new(&ansible);
    cmd.args(["localhost", "-i", "localhost,", "-c", "local", "-m", "ansible.builtin.template", "-a"])
        .arg(format!("src={} dest={}", root.join("templates/agent.yaml.j2").display(), dest.display()))
        .env("ANSIBLE_LOCALHOST_WARNING", "false");
    for v in &vars {
        cmd.args(["-e", v]);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "ansible template:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&dest).unwrap();
    assert!(text.contains("node: gpu-a01") && text.contains("exporter_listen_addr: 127.0.0.1:9400"), "{text}");
    let o = Command::new(&agent).args(["check-config", "--config"]).arg(&dest).output().unwrap();
    assert!(
        o.status.success(),
        "check-config of the rendered agent.yaml:\n{text}\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Issue 43 point 8: `ansible-playbook --check` of `agents.yml` on a fresh
/// node (this machine over a local connection, its paths in a scratch
/// folder: no agent binary, no unit, no config) passes and changes nothing,
/// saying what it would install and start; then a real run on the same
/// loopback node, with the agent installed by other means, writes and
/// checks its config and pins its host key, and a second run changes
/// nothing.
#[test]
fn the_playbook_passes_check_mode_on_a_fresh_node() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(playbook) = require("ansible-playbook", "ansible-core") else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ansible");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::write(dir.path().join("inventory.ini"), "[gpu_nodes]\ngpu-a01 ansible_connection=local\n").unwrap();
    std::fs::write(
        dir.path().join("engine_key.pub"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1lJ7n5Vd8kAa3S4b1p2yG6HkBqEjz8y1yPqTq0s3mZ nightshift-engine\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("nightshift-agent_0.1.0_amd64.deb"), "not installed in --check").unwrap();
    let play = |bin: &str| {
        let vars = [
            format!("nightshift_agent_deb={d}/nightshift-agent_0.1.0_amd64.deb"),
            format!("nightshift_engine_keys_file={d}/engine_key.pub"),
            format!("nightshift_config_dir={d}/etc"),
            format!("nightshift_state_dir={d}/state"),
            format!("nightshift_fingerprints_dir={d}/fingerprints"),
            format!("nightshift_agent_bin={bin}"),
            "ansible_become=false".into(),
            "ansible_python_interpreter=/usr/bin/python3".into(),
        ];
        let mut cmd = Command::new(&playbook);
        cmd.args(["--check", "-i"])
            .arg(dir.path().join("inventory.ini"))
            .arg(root.join("agents.yml"))
            .env("ANSIBLE_LOCALHOST_WARNING", "false")
            .env("ANSIBLE_NOCOLOR", "1");
        for v in &vars {
            cmd.args(["-e", v]);
        }
        let o = cmd.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        (o.status.success(), text)
    };
    let (ok, text) = play(&format!("{d}/no-such-agent"));
    assert!(ok, "--check on a fresh node:\n{text}");
    for said in ["would install nightshift-agent_0.1.0_amd64.deb", "would enable and start nightshift-agent"] {
        assert!(text.contains(said), "{said:?}:\n{text}");
    }
    assert!(text.contains("failed=0"), "{text}");
    // Nothing was written.
    for p in ["etc", "state", "fingerprints"] {
        assert!(!dir.path().join(p).exists(), "--check wrote {p}:\n{text}");
    }

    // A real run on loopback, the agent installed by other means (no apt,
    // no service here): configs written, checked by the real binary, the
    // host key made once and its fingerprint kept beside the play; a
    // second run changes nothing.
    let bins = workspace_bin_dir();
    let agent = bins.join("nightshift-agent");
    let k = Command::new(&agent).args(["keygen", "--out"]).arg(dir.path().join("engine_key")).output().unwrap();
    assert!(k.status.success(), "{k:?}");
    std::fs::write(dir.path().join("nccl.conf"), "").unwrap();
    let real = |extra: &[String]| {
        let mut cmd = Command::new(&playbook);
        cmd.args(["-i"])
            .arg(dir.path().join("inventory.ini"))
            .arg(root.join("agents.yml"))
            .env("ANSIBLE_LOCALHOST_WARNING", "false")
            .env("ANSIBLE_NOCOLOR", "1");
        for v in [
            "nightshift_agent_deb=".to_string(),
            format!("nightshift_engine_keys_file={d}/engine_key.pub"),
            format!("nightshift_config_dir={d}/etc"),
            format!("nightshift_state_dir={d}/state"),
            format!("nightshift_fingerprints_dir={d}/fingerprints"),
            format!("nightshift_agent_bin={}", agent.display()),
            format!("nightshift_nccl_conf={d}/nccl.conf"),
            format!("nightshift_drop_caches_path={d}/drop_caches"),
            "nightshift_backend=sim".into(),
            "nightshift_manage_service=false".into(),
            "ansible_become=false".into(),
            "ansible_python_interpreter=/usr/bin/python3".into(),
        ]
        .iter()
        .chain(extra)
        {
            cmd.args(["-e", v]);
        }
        let o = cmd.output().unwrap();
        (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (ok, text) = real(&[]);
    assert!(ok, "a real run:\n{text}");
    let fp = std::fs::read_to_string(dir.path().join("fingerprints/gpu-a01")).unwrap();
    assert!(fp.starts_with("SHA256:"), "{fp}");
    let o = Command::new(&agent)
        .args(["check-config", "--config"])
        .arg(dir.path().join("etc/agent.yaml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let (ok, text) = real(&[]);
    assert!(ok && text.contains("changed=0"), "the second run changes nothing:\n{text}");
}
