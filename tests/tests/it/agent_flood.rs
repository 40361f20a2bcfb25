//! The agent binary as a node runs it. Out of file descriptors: run under
//! `prlimit --nofile`, flooded with more idle connections than it may hold
//! open, it keeps its listener (accept errors back off instead of ending
//! the server) and answers the engine again once the flood's connections
//! time out. And its state dir: one agent at a time, and a state dir used
//! before does not start without its state log unless told.

use std::time::Duration;

use nightshift_proto::ssh::client::{AgentConnection, ClientConfig};
use nightshift_proto::{NoArgs, Op, Request};
use nightshift_tests::external::{Daemon, free_port, require, workspace_bin_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fd_limit_hit_leaves_the_agent_answering() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(prlimit) = require("prlimit", "util-linux") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let engine_key = nightshift_tests::engine_key(d);
    let port = free_port();
    std::fs::write(
        d.join("agent.yaml"),
        format!(
            "version: 1\nnode: fd1\nlisten_addr: 127.0.0.1:{port}\nstate_dir: state\nhost_key_path: host_key\n\
             authorized_keys_path: engine_key.pub\nbackend: sim\nsim: {{profile: h100-sxm, gpus: 2}}\n\
             ssh: {{preauth_timeout_secs: 2, max_unauthenticated: 5000, max_unauthenticated_per_source: 5000}}\n"
        ),
    )
    .unwrap();
    let agent = workspace_bin_dir().join("nightshift-agent");
    let argv: Vec<String> = vec![
        prlimit.display().to_string(),
        "--nofile=128:128".into(),
        "--".into(),
        agent.display().to_string(),
        "run".into(),
        "--config".into(),
        d.join("agent.yaml").display().to_string(),
    ];
    let mut daemon = Daemon::start_in(&argv, &d.join("agent.log"), d);
    // Its banner names the host key to pin.
    let mut fingerprint = None;
    for _ in 0..200 {
        if let Some(l) = daemon.log_text().lines().find(|l| l.starts_with("nightshift-agent fd1"))
            && let Some(fp) = l.split("host key ").nth(1)
        {
            fingerprint = Some(fp.split_whitespace().next().unwrap().to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fingerprint = fingerprint.unwrap_or_else(|| panic!("the agent did not start:\n{}", daemon.log_text()));
    let cfg = ClientConfig::new(format!("127.0.0.1:{port}"), fingerprint, engine_key);
    let engine = AgentConnection::connect(&cfg).await.unwrap();

    // More idle connections than the agent has descriptors for. Once its
    // table is full the kernel's backlog fills too and connects stall, so
    // each try gets a short timeout.
    let mut idle = Vec::new();
    for _ in 0..400 {
        match tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(("127.0.0.1", port)))
            .await
        {
            Ok(Ok(s)) => idle.push(s),
            _ => break,
        }
    }
    assert!(idle.len() > 128, "the flood did not exceed the agent's 128 descriptors ({} connections)", idle.len());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "the agent exited:\n{}", daemon.log_text());
    assert!(
        daemon.log_text().contains("cannot accept a connection now; retrying"),
        "the agent never ran out of descriptors:\n{}",
        daemon.log_text()
    );
    drop(idle);
    // The flood's connections time out; the agent answers new ones.
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(engine);
    let fresh = AgentConnection::connect(&cfg).await.unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    let r = fresh.call(&Request::new("after-flood", Op::Inventory(NoArgs {}))).await.unwrap();
    assert!(r.ok, "{r:?}");
    assert!(!daemon.log_text().contains("listener died"), "{}", daemon.log_text());
}

fn agent_yaml(d: &std::path::Path, name: &str, port: u16) -> std::path::PathBuf {
    let path = d.join(name);
    std::fs::write(
        &path,
        format!(
            "version: 1\nnode: st1\nlisten_addr: 127.0.0.1:{port}\nstate_dir: state\nhost_key_path: state/host_key\n\
             authorized_keys_path: engine_key.pub\nbackend: sim\nsim: {{profile: h100-sxm, gpus: 2}}\n"
        ),
    )
    .unwrap();
    path
}

/// A run that should be refused at start: its exit status and stderr.
fn refused_start(config: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(workspace_bin_dir().join("nightshift-agent"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Issue 46 point 4: two agents on one state dir both started and both
/// applied the same request id; a lost state.log started silently with no
/// holds while the GPUs stayed capped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_per_state_dir_and_no_silent_start_without_its_state_log() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    nightshift_tests::engine_key(d);
    let first = agent_yaml(d, "agent.yaml", free_port());
    let argv: Vec<String> = vec![
        workspace_bin_dir().join("nightshift-agent").display().to_string(),
        "run".into(),
        "--config".into(),
        first.display().to_string(),
    ];
    let banner = |daemon: &Daemon| daemon.log_text().lines().any(|l| l.starts_with("nightshift-agent st1"));
    let mut daemon = Daemon::start_in(&argv, &d.join("agent.log"), d);
    for _ in 0..200 {
        if banner(&daemon) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(banner(&daemon), "the agent did not start:\n{}", daemon.log_text());
    // A second agent on the same state dir (its own port).
    let second = agent_yaml(d, "agent2.yaml", free_port());
    let (code, err) = refused_start(&second, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("held by another nightshift-agent (pid {})", daemon.child.id())), "{err}");
    // The first stops; its state log is lost (a restore gone wrong).
    let _ = daemon.child.kill();
    let _ = daemon.child.wait();
    std::fs::remove_file(d.join("state/state.log")).unwrap();
    let (code, err) = refused_start(&first, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected the state log of a state dir used before") && err.contains("--new-state"), "{err}");
    assert!(!d.join("state/state.log").exists(), "the refused start wrote no state log");
    std::fs::write(d.join("state/state.log"), "").unwrap();
    let (code, err) = refused_start(&first, &[]);
    assert_eq!(code, Some(2), "an empty one is refused too: {err}");
    // Told to, it starts with no holds.
    let argv: Vec<String> = argv.into_iter().chain(["--new-state".to_string()]).collect();
    let daemon = Daemon::start_in(&argv, &d.join("agent-new.log"), d);
    for _ in 0..200 {
        if banner(&daemon) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(banner(&daemon), "--new-state did not start:\n{}", daemon.log_text());
}
