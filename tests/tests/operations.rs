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

const DOC: &str = include_str!("../../docs/OPERATIONS.md");

/// The walkthrough's command lines, as written.
fn documented_commands() -> Vec<String> {
    let start = DOC.find("<!-- walkthrough:begin -->").expect("walkthrough:begin marker");
    let end = DOC.find("<!-- walkthrough:end -->").expect("walkthrough:end marker");
    DOC[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("nightshift"))
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
    ran: Vec<String>,
}

impl Lab {
    fn argv(&mut self, line: &str) -> Vec<String> {
        self.ran.push(line.to_string());
        self.expand(line)
    }

    /// A documented line with this lab's port and token.
    fn expand(&self, line: &str) -> Vec<String> {
        line.replace("http://127.0.0.1:8080", &format!("http://{}", self.web))
            .replace("$TOKEN", &self.token)
            .split_whitespace()
            .map(str::to_string)
            .collect()
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
    let bins = workspace_bin_dir();
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    // mkdir lab && cp -r examples runbooks lab/ && cd lab/examples
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    copy_dir(&repo.join("runbooks"), &tmp.path().join("lab/runbooks"));
    let dir = tmp.path().join("lab/examples");
    copy_dir(&repo.join("examples"), &dir);
    let (a1, a2, web) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut lab = Lab { dir, bins, web: web.clone(), token: String::new(), ran: Vec::new() };
    // The only change to the examples: free ports.
    lab.edit("agent.yaml", |t| t.replace("127.0.0.1:2222", &a1));
    lab.edit("fleet.yaml", |t| t.replace("127.0.0.1:2222", &a1).replace("127.0.0.1:2223", &a2));
    lab.edit("engine.yaml", |t| t.replace("127.0.0.1:8080", &web));

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
    let out = lab.run("nightshift token --name alice --role operator");
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

    eprintln!("walkthrough took {:?}", t0.elapsed());
    // The document and this test ran the same commands.
    assert_eq!(lab.ran, documented_commands(), "docs/OPERATIONS.md's walkthrough and this test differ");
    drop((engine, agent1, agent2));
}
