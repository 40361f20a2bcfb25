//! The `slurm` scheduler adapter against a real single-node Slurm: munged,
//! slurmctld and slurmd (Debian `munge`, `slurmctld`, `slurmd`,
//! `slurm-client`) started here on loopback ports with their own key,
//! socket and state in a temporary folder.
//!
//! nightshift drains with a reason it owns, resumes its own drain, refuses
//! to resume a drain a person set (and leaves the person's reason alone),
//! and a failing or hung `scontrol` ends the run with a clear audited error
//! instead of hanging it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{AuditRecord, RecordKind};
use nightshift_engine::engine::Engine;
use nightshift_engine::runs::{RunOutcome, RunSummary, Target};
use nightshift_tests::external::{Daemon, free_port, require};
use nightshift_tests::{TestAgent, engine_setup, eventually, manual_run};

/// A running single-node Slurm cluster.
struct Slurm {
    conf: PathBuf,
    ctld: Daemon,
    slurmd: Daemon,
    _munged: Daemon,
}

fn text(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Slurm {
    fn start(dir: &Path) -> Slurm {
        let munge_dir = dir.join("munge");
        std::fs::create_dir_all(&munge_dir).unwrap();
        std::fs::set_permissions(&munge_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let key = munge_dir.join("munge.key");
        let bytes: Vec<u8> = (0..1024u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = munge_dir.join("socket");
        let p = |p: &Path| p.display().to_string();
        let munged = Daemon::start(
            &[
                "munged".into(),
                "--force".into(),
                "--foreground".into(),
                format!("--key-file={}", p(&key)),
                format!("--socket={}", p(&socket)),
                format!("--pid-file={}", p(&munge_dir.join("pid"))),
                format!("--seed-file={}", p(&munge_dir.join("seed"))),
                format!("--log-file={}", p(&munge_dir.join("log"))),
            ],
            &dir.join("munged.log"),
        );
        let end = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < end, "munged did not start:\n{}", munged.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }

        // slurmctld checks that it runs on the host named in SlurmctldHost.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let host = host.trim().split('.').next().unwrap().to_string();
        let user = text("id", &["-un"]);
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        let d = p(dir);
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=nightshift-test\nSlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
                 SlurmUser={user}\nSlurmdUser={user}\n\
                 AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={socket}\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
                 SelectType=select/linear\nMpiDefault=none\nReturnToService=2\n\
                 SlurmdParameters=config_overrides\n\
                 NodeName=gpu01 NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN\n\
                 PartitionName=gpu Nodes=gpu01 Default=YES MaxTime=INFINITE State=UP\n",
                socket = p(&socket),
            ),
        )
        .unwrap();
        let ctld = Daemon::start(&["slurmctld".into(), "-D".into(), "-f".into(), p(&conf)], &dir.join("slurmctld.log"));
        std::thread::sleep(Duration::from_millis(500));
        let slurmd = Daemon::start(
            &["slurmd".into(), "-D".into(), "-N".into(), "gpu01".into(), "-f".into(), p(&conf)],
            &dir.join("slurmd.log"),
        );
        let s = Slurm { conf, ctld, slurmd, _munged: munged };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let line = s.show("gpu01");
            if state(&line) == "IDLE" {
                break;
            }
            assert!(
                Instant::now() < end,
                "slurm node gpu01 did not come up idle: {line}\nslurmctld:\n{}\nslurmd:\n{}",
                s.ctld.log_text(),
                s.slurmd.log_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        s
    }

    /// `scontrol` as a person at the console would run it.
    fn scontrol(&self, args: &[&str]) -> std::process::Output {
        Command::new("scontrol").args(args).env("SLURM_CONF", &self.conf).output().expect("scontrol runs")
    }

    fn show(&self, node: &str) -> String {
        let out = self.scontrol(&["--oneliner", "show", "node", node]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.ctld.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig} slurmctld");
    }
}

/// The `State=` field of `scontrol --oneliner show node`.
fn state(line: &str) -> &str {
    line.split_whitespace().find_map(|f| f.strip_prefix("State=")).unwrap_or("")
}

/// The `Reason=` field (it runs to the end of the line).
fn reason(line: &str) -> Option<String> {
    line.find(" Reason=").map(|i| line[i + 8..].trim().to_string())
}

async fn run(engine: &Engine, runbook: &str, node: &str) -> (RunSummary, Vec<AuditRecord>) {
    let s = engine
        .submit(manual_run(runbook, Target::node(node)))
        .await
        .unwrap_or_else(|e| panic!("{runbook} on {node} not accepted: {e:?}"));
    let id = s.run().unwrap_or_else(|| panic!("{runbook} on {node} did not start: {s:?}")).id.clone();
    let summary = eventually(60, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some()))
        .await
        .unwrap_or_else(|| panic!("{runbook} on {node} did not end"));
    (summary, engine.run_records(&id).unwrap())
}

fn action_results(records: &[AuditRecord]) -> Vec<&AuditRecord> {
    records.iter().filter(|r| r.kind == RecordKind::ActionResult).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_adapter_against_a_real_slurm() {
    for (program, package) in
        [("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("scontrol", "slurm-client")]
    {
        if require(program, package).is_none() {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let slurm = Slurm::start(&dir.path().join("slurm"));
    let conf = slurm.conf.display().to_string();
    let sim = SimConfig { gpus: 1, ..SimConfig::default() };
    // gpu01 is the Slurm node; gpu02's agent names a node Slurm does not
    // know (a misconfigured node_name), so its scontrol fails.
    let a = TestAgent::start(
        dir.path(),
        "gpu01",
        sim.clone(),
        &format!("scheduler: {{kind: slurm, slurm_conf: '{conf}', timeout_secs: 3}}\n"),
    )
    .await;
    let b = TestAgent::start(
        dir.path(),
        "gpu02",
        sim,
        &format!("scheduler: {{kind: slurm, node_name: gpu99, slurm_conf: '{conf}', timeout_secs: 3}}\n"),
    )
    .await;
    let manifest = "trigger: {type: manual}\nscope: node\ncooldown_secs: 0\nmax_attempts_per_day: 100\n";
    let cfg = engine_setup(
        dir.path(),
        &[&a, &b],
        &[
            (
                "take-out",
                manifest,
                "let r = drain(\"fan swap needed\");\nif !r.ok { fail(r.error); }\nkeep_holds(600);\n",
            ),
            ("put-back", manifest, "let r = resume();\nif !r.ok { fail(r.error); }\n"),
        ],
        "limits: {action_timeout_secs: 20}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.connected_agents() == 2).then_some(())).await.is_some());

    // 1. A failing scontrol (Slurm does not know the node): the run fails
    //    and the audit says which command failed and what it printed.
    let (s, records) = run(&engine, "take-out", "gpu02").await;
    assert_eq!(s.outcome, Some(RunOutcome::Failed), "{s:?}");
    let results = action_results(&records);
    assert_eq!(results.len(), 1, "{records:?}");
    let err = results[0].data["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("scontrol --oneliner show node gpu99") && err.contains("failed with exit status"),
        "the audit names the failing command: {err}"
    );
    assert_eq!(results[0].data["applied"], false);

    // 2. nightshift drains with a reason it owns.
    let (s, records) = run(&engine, "take-out", "gpu01").await;
    assert_eq!(s.outcome, Some(RunOutcome::Succeeded), "{s:?} {records:?}");
    let line = slurm.show("gpu01");
    assert!(state(&line).contains("DRAIN"), "{line}");
    let ours = reason(&line).unwrap();
    assert!(ours.starts_with(&format!("nightshift: {} fan swap needed", s.id)), "{line}");
    assert_eq!(action_results(&records)[0].data["applied"], true);

    // 3. ... and resumes its own drain.
    let (s, _) = run(&engine, "put-back", "gpu01").await;
    assert_eq!(s.outcome, Some(RunOutcome::Succeeded), "{s:?}");
    let line = slurm.show("gpu01");
    assert!(!state(&line).contains("DRAIN"), "{line}");

    // 4. A person drains the node: nightshift neither resumes it nor
    //    overwrites the reason.
    let out = slurm.scontrol(&["update", "NodeName=gpu01", "State=DRAIN", "Reason=fan swap by dave"]);
    assert!(out.status.success(), "{out:?}");
    let (s, records) = run(&engine, "put-back", "gpu01").await;
    assert_eq!(s.outcome, Some(RunOutcome::Failed), "{s:?}");
    let results = action_results(&records);
    if let Some(r) = results.first() {
        // Refused by the agent (the engine may also refuse before sending).
        assert_eq!(r.data["applied"], false, "{r:?}");
    }
    let (_, records) = run(&engine, "take-out", "gpu01").await;
    for r in action_results(&records).into_iter().filter(|r| r.data["op"] == "drain") {
        assert_eq!(r.data["applied"], false, "a person's drain is left as it is: {r:?}");
    }
    let line = slurm.show("gpu01");
    assert!(state(&line).contains("DRAIN"), "{line}");
    assert!(reason(&line).unwrap().starts_with("fan swap by dave"), "{line}");
    let out = slurm.scontrol(&["update", "NodeName=gpu01", "State=RESUME"]);
    assert!(out.status.success(), "{out:?}");
    // The engine learns the person's resume from the agent's inventory.
    assert!(
        eventually(30, || (!engine.node("gpu01").unwrap().state.drained).then_some(())).await.is_some(),
        "{:?}",
        engine.node("gpu01").unwrap().state
    );

    // 5. A hung controller: scontrol waits on it, the agent kills scontrol
    //    at its 3 s timeout, and the run fails saying so.
    slurm.signal("-STOP");
    let t = Instant::now();
    let (s, records) = run(&engine, "take-out", "gpu01").await;
    let took = t.elapsed();
    slurm.signal("-CONT");
    assert_eq!(s.outcome, Some(RunOutcome::Failed), "{s:?}");
    assert!(took < Duration::from_secs(15), "a hung scontrol held the run for {took:?}");
    let results = action_results(&records);
    assert_eq!(results.len(), 1, "{records:?}");
    let err = results[0].data["error"].as_str().unwrap_or_default();
    assert!(err.contains("did not finish within 3 s and was killed"), "the audit says it timed out: {err}");
    assert_eq!(results[0].data["applied"], false);
    // Nothing was changed behind the timeout.
    let line = slurm.show("gpu01");
    assert!(!state(&line).contains("DRAIN"), "{line}");

    eprintln!("hung: {err} (took {took:?})");
    // The audit chain verifies after all of it.
    let report = engine.verify().unwrap();
    assert!(report.ok, "{report:?}");
}
