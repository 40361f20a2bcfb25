//! docs/OPERATIONS.md's "Zero to two nodes" walkthrough, run with the real
//! `nightshift` and `nightshift-agent` binaries in a copy of `examples/`:
//! two sim agents, one engine, a token, a dry run, a verified audit chain.
//!
//! The commands run here and the `nightshift…` lines of the walkthrough
//! must be the same list, so the document cannot drift from what works.
//! Only the ports differ (free ones instead of 2222, 2223 and 8080).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nightshift_tests::external::{Daemon, free_port, workspace_bin_dir};

const DOC: &str = include_str!("../../../docs/OPERATIONS.md");

/// The walkthrough's command lines, as written.
fn documented_commands() -> Vec<String> {
    let start = DOC.find("<!-- walkthrough:begin -->").expect("walkthrough:begin marker");
    let end = DOC.find("<!-- walkthrough:end -->").expect("walkthrough:end marker");
    DOC[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("nightshift") || l.starts_with("kill -HUP"))
        .map(|l| l.trim_end_matches('&').trim().to_string())
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_name() == "state" {
            continue; // what earlier local runs of the examples left
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

struct Lab {
    dir: PathBuf,
    bins: PathBuf,
    web: String,
    token: String,
    bob: String,
    ran: Vec<String>,
}

impl Lab {
    fn argv(&mut self, line: &str) -> Vec<String> {
        self.ran.push(line.to_string());
        self.expand(line)
    }

    /// A documented line with this lab's port and token.
    fn expand(&self, line: &str) -> Vec<String> {
        let line = line
            .replace("http://127.0.0.1:8080", &format!("http://{}", self.web))
            .replace("$TOKEN", &self.token)
            .replace("$BOB", &self.bob);
        // Words as a shell splits them: a "quoted reason" is one.
        let mut words = Vec::new();
        let mut word = String::new();
        let (mut quoted, mut any) = (false, false);
        for c in line.chars() {
            match c {
                '"' => (quoted, any) = (!quoted, true),
                c if c.is_whitespace() && !quoted => {
                    if any {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                c => {
                    word.push(c);
                    any = true;
                }
            }
        }
        if any {
            words.push(word);
        }
        words
    }

    fn command(&self, argv: &[String]) -> Command {
        let mut c = Command::new(self.bins.join(&argv[0]));
        c.args(&argv[1..]).current_dir(&self.dir).env_remove("NIGHTSHIFT_SERVER").env_remove("NIGHTSHIFT_TOKEN");
        c
    }

    /// Run a documented command to completion; it must succeed.
    fn run(&mut self, line: &str) -> String {
        let argv = self.argv(line);
        let out: Output = self.command(&argv).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "`{line}` failed ({}):\n{text}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Start a documented long-running command (the `&` lines).
    fn start(&mut self, line: &str, log: &str) -> Daemon {
        let mut argv = self.argv(line);
        argv[0] = self.bins.join(&argv[0]).display().to_string();
        Daemon::start_in(&argv, &self.dir.join(log), &self.dir)
    }

    fn edit(&self, file: &str, f: impl FnOnce(String) -> String) {
        let p = self.dir.join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, f(text)).unwrap();
    }
}

fn wait_tcp(addr: &str, what: &Daemon) {
    let end = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "nothing listens on {addr}; log:\n{}", what.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn zero_to_two_nodes_as_documented() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let bins = workspace_bin_dir();
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    // mkdir lab && cp -r examples runbooks lab/ && cd lab/examples
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    copy_dir(&repo.join("runbooks"), &tmp.path().join("lab/runbooks"));
    let dir = tmp.path().join("lab/examples");
    copy_dir(&repo.join("examples"), &dir);
    let (a1, a2, web, am) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut lab = Lab { dir, bins, web: web.clone(), token: String::new(), bob: String::new(), ran: Vec::new() };
    // The only change to the examples: free ports.
    lab.edit("agent.yaml", |t| t.replace("127.0.0.1:2222", &a1));
    lab.edit("fleet.yaml", |t| t.replace("127.0.0.1:2222", &a1).replace("127.0.0.1:2223", &a2));
    lab.edit("engine.yaml", |t| t.replace("127.0.0.1:8080", &web).replace("127.0.0.1:9093", &am));

    // 1. The engine's key, trusted by the agents.
    lab.run("nightshift keygen --out state/engine/engine_key");
    std::fs::copy(lab.dir.join("state/engine/engine_key.pub"), lab.dir.join("authorized_keys")).unwrap();

    // 2. The second node's config, checked; both agents started.
    let second = std::fs::read_to_string(lab.dir.join("agent.yaml")).unwrap().replace("gpu-node-01", "gpu-node-02");
    std::fs::write(lab.dir.join("agent-02.yaml"), second.replace(&a1, &a2)).unwrap();
    lab.run("nightshift-agent check-config --config agent.yaml");
    lab.run("nightshift-agent check-config --config agent-02.yaml");
    let agent1 = lab.start("nightshift-agent run --config agent.yaml", "agent-01.log");
    let agent2 = lab.start("nightshift-agent run --config agent-02.yaml", "agent-02.log");
    wait_tcp(&a1, &agent1);
    wait_tcp(&a2, &agent2);

    // 3. Their host keys pinned in fleet.yaml, in order.
    for config in ["agent.yaml", "agent-02.yaml"] {
        let out = lab.run(&format!("nightshift-agent fingerprint --config {config}"));
        let fp = out.split_whitespace().find(|w| w.starts_with("SHA256:")).expect("a fingerprint").to_string();
        lab.edit("fleet.yaml", |t| t.replacen("SHA256:replace-with-the-agent-fingerprint", &fp, 1));
    }

    // 4. A token, its hash under auth.tokens.
    let out = lab.run("nightshift token --name alice --role admin");
    lab.token = out.split_whitespace().find(|w| w.starts_with("ns_")).expect("a token").to_string();
    let line = out.lines().find(|l| l.trim_start().starts_with("- {name: alice")).expect("the config line");
    let entry = line.trim_start().trim_start_matches("- ").to_string();
    lab.edit("engine.yaml", |t| t.replacen("tokens: []", &format!("tokens: [{entry}]"), 1));

    // 5. Runbooks checked, the engine started.
    lab.run("nightshift --config engine.yaml runbooks validate");
    let engine = lab.start("nightshift serve --config engine.yaml", "engine.log");
    wait_tcp(&web, &engine);

    // 6. Both agents connected; a dry run; the audit.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let out = lab
            .command(&lab.expand("nightshift --server http://127.0.0.1:8080 --token $TOKEN agents list"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.matches("connected").count() == 2 && !text.contains("unreachable") {
            break;
        }
        assert!(Instant::now() < end, "agents did not connect:\n{text}\nengine log:\n{}", engine.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
    lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN agents list");
    let out = lab.run(
        "nightshift --server http://127.0.0.1:8080 --token $TOKEN run gpu-overheat --node gpu-node-01 --gpu 0 --param hold_secs=2 --param watch_secs=2 --dry-run --yes",
    );
    assert!(out.contains("succeeded"), "{out}");
    let out = lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN audit list");
    assert!(out.contains("gpu-overheat") && out.contains("gpu-node-01"), "{out}");
    let out = lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN audit verify");
    assert!(out.contains("ok") || out.contains("verified"), "{out}");

    // 7. Bob's token, put in force by SIGHUP, no restart.
    let out = lab.run("nightshift token --name bob --role viewer");
    lab.bob = out.split_whitespace().find(|w| w.starts_with("ns_")).expect("a token").to_string();
    let line = out.lines().find(|l| l.trim_start().starts_with("- {name: bob")).expect("the config line");
    let entry = line.trim_start().trim_start_matches("- ").to_string();
    lab.edit("engine.yaml", |t| t.replacen("tokens: [", &format!("tokens: [{entry}, "), 1));
    let before = lab
        .command(&lab.expand("nightshift --server http://127.0.0.1:8080 --token $BOB agents list"))
        .output()
        .unwrap();
    assert!(!before.status.success(), "bob's token works before the reload");
    lab.ran.push("kill -HUP <the engine's pid>".into());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(engine.child.id() as i32), nix::sys::signal::Signal::SIGHUP)
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while !engine.log_text().contains("reloaded") {
        assert!(Instant::now() < end, "no reload after SIGHUP; engine log:\n{}", engine.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = lab.run("nightshift --server http://127.0.0.1:8080 --token $BOB agents list");
    assert_eq!(out.matches("connected").count(), 2, "{out}");
    // The reload is in the audit, with what it changed.
    let export = lab
        .command(&lab.expand("nightshift --server http://127.0.0.1:8080 --token $TOKEN audit export --format jsonl"))
        .output()
        .unwrap();
    let export = String::from_utf8_lossy(&export.stdout);
    let reload = export.lines().find(|l| l.contains("\"config_reloaded\"")).expect("a config_reloaded record");
    assert!(reload.contains("\"tokens_added\":[\"bob\"]") && reload.contains("signal:SIGHUP"), "{reload}");

    // 8. The site's Alertmanager, with the shipped routes.
    let Some(am_bin) = nightshift_tests::external::require("prometheus-alertmanager", "prometheus-alertmanager") else {
        return;
    };
    let am_cluster = format!("127.0.0.1:{}", free_port());
    let documented_am = "prometheus-alertmanager --config.file=alertmanager.yml --storage.path=state/alertmanager --web.listen-address=127.0.0.1:9093";
    assert!(DOC.contains(documented_am), "docs/OPERATIONS.md step 8 changed");
    let mut argv: Vec<String> =
        documented_am.replace("127.0.0.1:9093", &am).split_whitespace().map(str::to_string).collect();
    argv[0] = am_bin.display().to_string();
    argv.push(format!("--cluster.listen-address={am_cluster}"));
    let alertmanager = Daemon::start_in(&argv, &lab.dir.join("alertmanager.log"), &lab.dir);
    wait_tcp(&am, &alertmanager);

    // 9. Shadow: a simulated DBE is answered by a shadow run, nothing drained.
    let out = lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN fleet mode");
    assert!(out.contains("the fleet is in shadow mode"), "{out}");
    let out = lab
        .run("nightshift --server http://127.0.0.1:8080 --token $TOKEN agents sim-fault gpu-node-01 ecc-dbe --gpu 3");
    assert!(out.contains("injected"), "{out}");
    let end = Instant::now() + Duration::from_secs(60);
    let report = loop {
        let out = lab
            .command(&lab.expand(
                "nightshift --server http://127.0.0.1:8080 --token $TOKEN runbooks shadow-report ecc-dbe-drain",
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains("gpu-node-01") && text.contains("drain") {
            break text;
        }
        assert!(Instant::now() < end, "no shadow run for the DBE:\n{text}\n{}", engine.log_text());
        std::thread::sleep(Duration::from_millis(500));
    };
    lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN runbooks shadow-report ecc-dbe-drain");
    let agents = lab
        .command(&lab.expand("nightshift --server http://127.0.0.1:8080 --token $TOKEN agents list"))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&agents.stdout).contains("drained"), "shadow drains nothing: {report}");

    // 10. Act: the real run drains and the notice reaches Alertmanager.
    let out = lab.run(
        "nightshift --server http://127.0.0.1:8080 --token $TOKEN fleet mode act --reason \"shadow report reviewed\"",
    );
    assert!(out.contains("the fleet is in act mode"), "{out}");
    let end = Instant::now() + Duration::from_secs(90);
    let page = loop {
        let alerts = get_json(&am, "/api/v2/alerts");
        let found =
            alerts.as_array().into_iter().flatten().find(|a| {
                a["labels"]["alertname"] == "NightshiftNotification" && a["labels"]["Hostname"] == "gpu-node-01"
            });
        if let Some(a) = found {
            break a.clone();
        }
        assert!(
            Instant::now() < end,
            "no notice reached Alertmanager: {alerts}\nengine log:\n{}\nalertmanager log:\n{}",
            engine.log_text(),
            alertmanager.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = page.to_string();
    assert!(text.contains(&format!("http://{web}/runs/r")), "the page links its run: {page}");
    let out = lab.run("nightshift --server http://127.0.0.1:8080 --token $TOKEN runs list --outcome needs_person");
    assert!(out.contains("ecc-dbe-drain") && out.contains("gpu-node-01"), "{out}");
    let agents = lab
        .command(&lab.expand("nightshift --server http://127.0.0.1:8080 --token $TOKEN agents list"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&agents.stdout).contains("drained"), "{}", String::from_utf8_lossy(&agents.stdout));

    eprintln!("walkthrough took {:?}", t0.elapsed());
    // The document and this test ran the same commands.
    assert_eq!(lab.ran, documented_commands(), "docs/OPERATIONS.md's walkthrough and this test differ");
    drop((engine, agent1, agent2, alertmanager));
}

/// `GET path` from `addr` (HTTP/1.0: the answer ends with the connection),
/// its body as JSON (null when it does not answer or is not JSON).
fn get_json(addr: &str, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return serde_json::Value::Null };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n").as_bytes())
        .is_err()
    {
        return serde_json::Value::Null;
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()).unwrap_or(serde_json::Value::Null)
}

/// `ReadWritePaths=` of a unit file, in order, `-` prefixes kept.
fn read_write_paths(unit: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix("ReadWritePaths="))
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// The agent installed as docs/OPERATIONS.md's "Each node" says, run in the
/// file-system sandbox its shipped unit asks for (`ProtectSystem=strict`:
/// everything read-only but the unit's `ReadWritePaths=`), with a temporary
/// folder standing for `/`. A managed config in `/etc` is changed and
/// rolled back over SSH: the folder is read-only, only the file is
/// writable, so the agent must write it in place (a temp file and rename,
/// as before, fails with "Read-only file system").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_rollback_in_the_agent_units_sandbox() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_proto::ssh::client::{AgentClient, ClientConfig};
    use nightshift_proto::{ConfigApplyArgs, ConfigRollbackArgs, Op, Outcome, Request};

    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let unit = std::fs::read_to_string(repo.join("examples/systemd/nightshift-agent.service")).unwrap();
    assert!(unit.lines().any(|l| l.trim() == "ProtectSystem=strict"), "the unit no longer sandboxes the agent");
    let rw = read_write_paths(&unit);
    assert!(rw.contains(&"/var/lib/nightshift-agent".to_string()), "{rw:?}");
    // A managed file that is missing must not stop the unit from starting:
    // every path but the state dir carries systemd's `-`.
    for p in rw.iter().filter(|p| p.as_str() != "/var/lib/nightshift-agent") {
        assert!(p.starts_with('-'), "ReadWritePaths={p} stops the unit when the file is missing: write -{p}");
    }
    assert!(rw.contains(&"-/etc/nccl.conf".to_string()), "{rw:?}");

    // The node's layout under a stand-in root.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let under = |p: &str| root.join(p.trim_start_matches('-').trim_start_matches('/'));
    let etc = under("/etc/nightshift");
    let state = under("/var/lib/nightshift-agent"); // StateDirectory=, made by systemd
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(under("/etc/nccl.conf"), "NCCL_DEBUG=WARN\n").unwrap();
    let key = nightshift_tests::engine_key(tmp.path());
    std::fs::copy(tmp.path().join("engine_key.pub"), etc.join("authorized_keys")).unwrap();
    std::fs::copy(repo.join("examples/policy.yaml"), etc.join("policy.yaml")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cfg: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo.join("examples/agent.yaml")).unwrap()).unwrap();
    let s = |p: &std::path::Path| serde_yaml::Value::from(p.display().to_string());
    cfg["listen_addr"] = addr.clone().into();
    cfg["state_dir"] = s(&state);
    cfg["host_key_path"] = s(&state.join("host_key"));
    cfg["authorized_keys_path"] = s(&etc.join("authorized_keys"));
    cfg["policy_path"] = s(&etc.join("policy.yaml"));
    cfg["flush_caches"]["drop_caches_path"] = s(&state.join("drop_caches"));
    cfg["flush_caches"]["registry_dir"] = s(&state.join("flush.d"));
    cfg["configs"]["nccl-env"]["path"] = s(&under("/etc/nccl.conf"));
    let config = etc.join("agent.yaml");
    std::fs::write(&config, serde_yaml::to_string(&cfg).unwrap()).unwrap();

    let bins = workspace_bin_dir();
    let sandbox = PathBuf::from(env!("CARGO_BIN_EXE_unit-sandbox"));
    let mut argv = vec![sandbox.display().to_string(), root.display().to_string()];
    for p in &rw {
        argv.extend(["--rw".to_string(), under(p).display().to_string()]);
    }
    argv.extend(["--".into(), bins.join("nightshift-agent").display().to_string(), "run".into(), "--config".into()]);
    argv.push(config.display().to_string());
    let agent = Daemon::start_in(&argv, &tmp.path().join("agent.log"), tmp.path());
    wait_tcp(&addr, &agent);
    // The sandbox holds: nothing else in /etc is writable.
    assert!(agent.log_text().is_empty() || !agent.log_text().contains("unit-sandbox:"), "{}", agent.log_text());

    let out = Command::new(bins.join("nightshift-agent"))
        .args(["fingerprint", "--config", &config.display().to_string()])
        .output()
        .unwrap();
    let fp = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .expect("a fingerprint")
        .to_string();
    let client = AgentClient::new(ClientConfig::new(addr.clone(), fp, key));
    let conn = client.connection().await.unwrap();
    let call = |id: &str, op: Op| {
        let conn = conn.clone();
        let req = Request::new(id, op);
        async move { conn.call(&req).await.unwrap() }
    };
    let r = call(
        "sandbox-apply",
        Op::ConfigApply(ConfigApplyArgs {
            name: "nccl-env".into(),
            content: "NCCL_P2P_DISABLE=1\n".into(),
            note: None,
            restart_consumer: true,
        }),
    )
    .await;
    assert!(r.ok, "config_apply in the sandbox: {r:?}\nagent log:\n{}", agent.log_text());
    assert_eq!(r.action().unwrap().outcome, Outcome::Applied);
    assert_eq!(std::fs::read_to_string(under("/etc/nccl.conf")).unwrap(), "NCCL_P2P_DISABLE=1\n");
    let r = call(
        "sandbox-rollback",
        Op::ConfigRollback(ConfigRollbackArgs { name: "nccl-env".into(), to_version: None, restart_consumer: true }),
    )
    .await;
    assert!(r.ok, "config_rollback in the sandbox: {r:?}\nagent log:\n{}", agent.log_text());
    assert_eq!(r.action().unwrap().outcome, Outcome::Applied);
    assert_eq!(std::fs::read_to_string(under("/etc/nccl.conf")).unwrap(), "NCCL_DEBUG=WARN\n");
    // Nothing else was written in /etc (no temp file left beside it).
    let mut names: Vec<String> = std::fs::read_dir(under("/etc"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["nccl.conf", "nightshift"]);
    assert!(agent.log_text().contains("written in place"), "{}", agent.log_text());
    drop(agent);
}
