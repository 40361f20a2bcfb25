//! The `slurm` scheduler adapter against a real single-node Slurm: munged,
//! slurmctld and slurmd (Debian `munge`, `slurmctld`, `slurmd`,
//! `slurm-client`) started here on loopback ports with their own key,
//! socket and state in a temporary folder.
//!
//! nightshift drains with a reason it owns, resumes its own drain, refuses
//! to resume a drain a person set (and leaves the person's reason alone),
//! and a failing or hung `scontrol` ends the run with a clear audited error
//! instead of hanging it. Scale-out reads Slurm's queue, powers a standby up
//! through Slurm's power saving, and takes a warm standby before a powered
//! down one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{AuditRecord, RecordKind};
use nightshift_engine::engine::Engine;
use nightshift_engine::runs::{RunOutcome, RunSummary, Target};
use nightshift_tests::external::{Daemon, free_port, kill_processes_naming, processes_naming, require};
use nightshift_tests::{TestAgent, engine_setup, eventually, manual_run};

/// A running single-node Slurm cluster.
struct Slurm {
    conf: PathBuf,
    ctld: Daemon,
    slurmd: Daemon,
    _munged: Daemon,
}

impl Drop for Slurm {
    /// Nothing of it is left running (issue 56 point 8): besides the
    /// daemons started here, a slurmd the controller's ResumeProgram
    /// started (a "boot") names this cluster's slurm.conf.
    fn drop(&mut self) {
        kill_processes_naming(&self.conf);
    }
}

fn text(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Slurm {
    fn start(dir: &Path) -> Slurm {
        Slurm::start_with(dir, "", "")
    }

    /// With `nodes`: more `NodeName=` lines (they join the partition), and
    /// `conf`: more settings (power saving).
    fn start_with(dir: &Path, nodes: &str, conf_extra: &str) -> Slurm {
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
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool-%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
                 SelectType=select/linear\nMpiDefault=none\nReturnToService=2\n\
                 SlurmdParameters=config_overrides\n\
                 {conf_extra}\
                 NodeName=gpu01 NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN\n\
                 {nodes}\
                 PartitionName=gpu Nodes=gpu01{more} Default=YES MaxTime=INFINITE State=UP\n",
                nodes = nodes.replace("{host}", &host),
                more = nodes
                    .lines()
                    .filter_map(|l| l.split_whitespace().next()?.strip_prefix("NodeName="))
                    .map(|n| format!(",{n}"))
                    .collect::<String>(),
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

/// A power program for Slurm's power saving in `dir`: it logs `NAME NODES`
/// to `dir/power.log`, then runs `body`. Its path.
fn power_script(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    let d = dir.display();
    std::fs::write(&p, format!("#!/bin/sh\necho \"{name} $1\" >> {d}/power.log\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

/// slurm.conf's power-saving lines with these programs.
fn power_saving_conf(resume: &str, suspend: &str) -> String {
    format!(
        "SuspendProgram={suspend}\nResumeProgram={resume}\nSuspendTime=86400\nSuspendTimeout=10\nResumeTimeout=60\n"
    )
}

/// Whether the daemons and the job commands these tests run are installed
/// (each missing one is reported by `require`).
fn slurm_with_jobs_installed() -> bool {
    [
        ("munged", "munge"),
        ("slurmctld", "slurmctld"),
        ("slurmd", "slurmd"),
        ("scontrol", "slurm-client"),
        ("sbatch", "slurm-client"),
        ("scancel", "slurm-client"),
    ]
    .into_iter()
    .all(|(program, package)| require(program, package).is_some())
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
    let _serial = nightshift_tests::serial::module(module_path!());
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
    // `check-config --live` asks the real Slurm (issue 43 point 8): gpu01
    // is Slurm's, gpu02's node_name (gpu99) is not; offline, neither is
    // contacted, and the unit's pre-start check does not wait on Slurm.
    let agent_bin = nightshift_tests::external::workspace_bin_dir().join("nightshift-agent");
    let check = |node: &str, live: bool| {
        let mut c = Command::new(&agent_bin);
        c.arg("check-config").arg("--config").arg(dir.path().join(format!("{node}.yaml")));
        if live {
            c.arg("--live");
        }
        c.current_dir(dir.path()).output().unwrap()
    };
    for node in ["gpu01", "gpu02"] {
        std::fs::write(dir.path().join(node).join("nccl.env"), "NCCL_DEBUG=WARN\n").unwrap();
    }
    let o = check("gpu01", true);
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{said}{}", String::from_utf8_lossy(&o.stderr));
    assert!(said.contains("scheduler    slurm: contacted; the node is"), "{said}");
    let o = check("gpu02", true);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("scheduler slurm: cannot read this node's state"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = check("gpu02", false);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("slurm: not contacted"), "{o:?}");
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
    assert!(eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.is_some());

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

/// Power saving, marks and quarantine against a real Slurm: gpu02 is a
/// `CLOUD` node kept powered down, with a ResumeProgram this test provides
/// (it "boots" the node by starting its slurmd, `-b`: reporting a reboot)
/// and a SuspendProgram (it stops it).
///
/// - scale-out powers gpu02 up through the scheduler (`scontrol update
///   State=POWER_UP` from a peer's agent: the node's own agent is off), the
///   ResumeProgram runs and the node joins; scale-in powers it down again;
/// - a no-pack mark sets the node's Slurm weight, and Slurm's own scheduler
///   then starts new work elsewhere (`sbatch --test-only`); the mark's end
///   puts the weight back;
/// - a person's drain keeps the person's reason through a no-pack mark;
/// - a DBE's quarantine drains the node with a reason naming the fault and
///   the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_power_saving_marks_and_quarantine() {
    let _serial = nightshift_tests::serial::module(module_path!());
    if !slurm_with_jobs_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("slurm");
    std::fs::create_dir_all(&sdir).unwrap();
    let d = sdir.display().to_string();
    let power_log = sdir.join("power.log");
    let script = |name: &str, body: &str| power_script(&sdir, name, body);
    // The "boot": gpu02's slurmd starts and reports a reboot; the "power
    // off": it stops.
    let resume = script(
        "resume",
        &format!(
            "for n in $(scontrol show hostnames \"$1\"); do slurmd -b -N \"$n\" -f {d}/slurm.conf > {d}/boot-$n.log 2>&1 & done\n"
        ),
    );
    let suspend = script(
        "suspend",
        &format!("for n in $(scontrol show hostnames \"$1\"); do kill $(cat {d}/slurmd-$n.pid) 2>/dev/null; done\n"),
    );
    let gpu02_port = free_port();
    let slurm = Slurm::start_with(
        &sdir,
        &format!(
            "NodeName=gpu02 NodeHostname={{host}} NodeAddr=127.0.0.1 Port={gpu02_port} CPUs=1 RealMemory=100 State=CLOUD\n"
        ),
        &power_saving_conf(&resume, &suspend),
    );
    let conf = slurm.conf.display().to_string();
    let sched = format!("scheduler: {{kind: slurm, slurm_conf: '{conf}', timeout_secs: 10}}\n");
    let sim = SimConfig { gpus: 1, ..SimConfig::default() };
    let a = TestAgent::start(dir.path(), "gpu01", sim.clone(), &sched).await;
    let mut b = TestAgent::start(dir.path(), "gpu02", sim, &sched).await;
    let b_addr = b.addr();
    let node_manifest = "trigger: {type: manual}\nscope: node\ncooldown_secs: 0\nmax_attempts_per_day: 100\n";
    let group_manifest = "trigger: {type: manual}\nscope: group\ncooldown_secs: 0\nmax_attempts_per_day: 100\n";
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cfg = engine_setup(
        dir.path(),
        &[&a, &b],
        &[
            (
                "grow",
                group_manifest,
                // As H4 does: the queue first (a held job waits), then the nodes.
                "let p = pool_pending();\nif p.known != true || p.jobs != 1 { fail(`the queue: ${p}`); }\nnote(`${p.jobs} job(s) waiting in the ${p.scheduler} queue, read by ${p.from}`);\nlet r = scale_out(1);\nif r.count == 0 { fail(`nothing to scale out: ${r.skipped}`); }\n",
            ),
            (
                "shrink",
                group_manifest,
                "let r = scale_in(1);\nif r.count == 0 { fail(`nothing to scale in: ${r.skipped}`); }\n",
            ),
            // The mark is a hold: kept 15 s after the run, then the agent
            // ends it and puts the weight back.
            (
                "no-pack",
                node_manifest,
                "let r = mark(\"no_pack\", \"memory pressure\");\nif !r.ok { fail(r.error); }\nkeep_holds(15);\n",
            ),
        ],
        "limits: {action_timeout_secs: 30}\n",
    );
    // The shipped DBE runbook, as it is.
    for f in ["ecc-dbe-drain.yaml", "ecc-dbe-drain.rhai"] {
        std::fs::copy(repo.join("runbooks").join(f), dir.path().join("runbooks").join(f)).unwrap();
    }
    // gpu02: a standby the scheduler keeps powered down.
    let fleet = std::fs::read_to_string(dir.path().join("fleet.yaml")).unwrap();
    let fleet = fleet.replace(
        &format!("  - name: gpu02\n    address: {b_addr}\n"),
        &format!("  - name: gpu02\n    standby: true\n    power_saving: true\n    address: {b_addr}\n"),
    );
    assert!(fleet.contains("power_saving: true"), "{fleet}");
    std::fs::write(dir.path().join("fleet.yaml"), fleet).unwrap();
    // gpu02 is powered down: its agent is off until the node boots.
    b.stop().await;
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || engine.node("gpu01").unwrap().state.connected.then_some(())).await.is_some());

    // 1. Scale-out reads the queue (one held job waits: Slurm keeps it
    //    PENDING), then powers gpu02 up through gpu01's agent; the
    //    ResumeProgram boots it; its agent comes up with it.
    let held = Command::new("sbatch")
        .args(["--parsable", "--hold", "-p", "gpu", "--output", "/dev/null", "--wrap", "true"])
        .env("SLURM_CONF", &slurm.conf)
        .output()
        .unwrap();
    let held = String::from_utf8_lossy(&held.stdout).trim().to_string();
    assert!(!held.is_empty(), "sbatch --hold gave no job id");
    let s = engine.submit(manual_run("grow", Target::group("pool", "a"))).await.unwrap();
    let id = s.run().unwrap().id.clone();
    let done = eventually(60, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    assert_eq!(done.outcome, Some(RunOutcome::Succeeded), "{done:?} {:?}", engine.run_records(&id));
    let records = engine.run_records(&id).unwrap();
    let up = action_results(&records).into_iter().find(|r| r.data["op"] == "power_node").cloned();
    let up = up.unwrap_or_else(|| panic!("no power_node: {records:?}"));
    assert_eq!((up.node.as_deref(), up.data["applied"].clone()), (Some("gpu01"), true.into()), "{up:?}");
    let booted = eventually(30, || {
        let log = std::fs::read_to_string(&power_log).unwrap_or_default();
        log.contains("resume gpu02").then_some(log)
    })
    .await;
    assert!(booted.is_some(), "the ResumeProgram never ran: {}", slurm.ctld.log_text());
    let joined = eventually(60, || {
        let line = slurm.show("gpu02");
        (state(&line).starts_with("IDLE") && !line.contains("POWER")).then_some(line)
    })
    .await;
    assert!(
        joined.is_some(),
        "gpu02 did not join: {}\nits boot:\n{}\nslurmctld:\n{}",
        slurm.show("gpu02"),
        std::fs::read_to_string(sdir.join("boot-gpu02.log")).unwrap_or_default(),
        slurm.ctld.log_text()
    );
    b.restart().await;
    assert!(eventually(30, || engine.node("gpu02").unwrap().state.connected.then_some(())).await.is_some());
    let noted = records.iter().any(|r| {
        r.kind == RecordKind::Note
            && r.data["text"].as_str().is_some_and(|t| t.contains("1 job(s) waiting in the slurm queue, read by gpu01"))
    });
    assert!(noted, "the queue as read: {records:?}");
    // With the job gone the agent reads an empty queue.
    let _ = Command::new("scancel").arg(&held).env("SLURM_CONF", &slurm.conf).output();
    let q = nightshift_proto::ssh::client::AgentConnection::connect(&a.client_config()).await.unwrap();
    let mut last = None;
    for i in 0..60 {
        let op = nightshift_proto::Op::SchedulerPending(nightshift_proto::SchedulerPendingArgs {
            partition: Some("gpu".into()),
        });
        let r = q.call(&nightshift_proto::Request::new(format!("pending-{i}"), op)).await.unwrap();
        let p: nightshift_proto::PendingWork = serde_json::from_value(r.result.clone().unwrap_or_default()).unwrap();
        if p.jobs == Some(0) {
            assert_eq!((p.scheduler.as_str(), p.gpus), ("slurm", Some(0)), "{p:?}");
            last = None;
            break;
        }
        last = Some(r);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last.is_none(), "the queue after scancel: {last:?}");
    q.close().await;

    // 2. No-pack: Slurm's scheduler picks the other node for new work while
    //    the mark stands, and the weight goes back when it ends.
    // Where Slurm's scheduler starts a new job (a real one: it runs on the
    // node's slurmd, then is cancelled).
    let placed = || async {
        let out = Command::new("sbatch")
            // Job output off the work tree (sbatch writes slurm-N.out in its cwd).
            .args(["--parsable", "-p", "gpu", "--output", "/dev/null", "--wrap", "sleep 30"])
            .env("SLURM_CONF", &slurm.conf)
            .output()
            .unwrap();
        let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success() && !job.is_empty(), "sbatch: {out:?}");
        let node = eventually(30, || {
            let o = slurm.scontrol(&["--oneliner", "show", "job", &job]);
            let line = String::from_utf8_lossy(&o.stdout).into_owned();
            let n = line.split_whitespace().find_map(|f| f.strip_prefix("NodeList="))?.to_string();
            (line.contains("JobState=RUNNING") && n != "(null)").then_some(n)
        })
        .await
        .unwrap_or_else(|| panic!("job {job} never started"));
        let _ = Command::new("scancel").arg(&job).env("SLURM_CONF", &slurm.conf).output();
        node
    };
    assert_eq!(placed().await, "gpu01", "with equal weights Slurm starts on gpu01");
    let (s, _) = run(&engine, "no-pack", "gpu01").await;
    assert_eq!(s.outcome, Some(RunOutcome::Succeeded), "{s:?}");
    assert!(slurm.show("gpu01").contains("Weight=65000"), "{}", slurm.show("gpu01"));
    assert_eq!(placed().await, "gpu02", "a no-pack node is skipped for new work");
    let restored = eventually(60, || slurm.show("gpu01").contains("Weight=1 ").then_some(())).await;
    assert!(restored.is_some(), "the mark's end puts the weight back: {}", slurm.show("gpu01"));

    // 3. A person's drain: a no-pack mark sets the weight and leaves the
    //    reason as the person wrote it; the person resumes the node.
    let out = slurm.scontrol(&["update", "NodeName=gpu01", "State=DRAIN", "Reason=dave: reseating a riser"]);
    assert!(out.status.success(), "{out:?}");
    let (s, _) = run(&engine, "no-pack", "gpu01").await;
    assert_eq!(s.outcome, Some(RunOutcome::Succeeded), "{s:?}");
    let line = slurm.show("gpu01");
    assert!(reason(&line).unwrap_or_default().starts_with("dave: reseating a riser"), "{line}");
    assert!(line.contains("Weight=65000"), "{line}");
    let restored = eventually(60, || slurm.show("gpu01").contains("Weight=1 ").then_some(())).await;
    assert!(restored.is_some(), "{}", slurm.show("gpu01"));
    let line = slurm.show("gpu01");
    assert!(reason(&line).unwrap_or_default().starts_with("dave: reseating a riser"), "{line}");
    let out = slurm.scontrol(&["update", "NodeName=gpu01", "State=RESUME"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        eventually(30, || (!engine.node("gpu01").unwrap().state.drained).then_some(())).await.is_some(),
        "{:?}",
        engine.node("gpu01").unwrap().state
    );

    // 4. A DBE (gpu02 serving too, so the blast radius allows the drain):
    //    the quarantine's reason names the fault and the run.
    let c = nightshift_proto::ssh::client::AgentConnection::connect(&a.client_config()).await.unwrap();
    let r = c
        .call(&nightshift_proto::Request::new(
            "slurm-dbe",
            nightshift_proto::Op::SimFault(nightshift_proto::SimFault::EccDbe { gpu: 0, count: 1 }),
        ))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    let drained = eventually(60, || {
        let line = slurm.show("gpu01");
        state(&line).contains("DRAIN").then_some(line)
    })
    .await
    .unwrap_or_else(|| {
        let recs = engine.audit().tail(0, usize::MAX).unwrap();
        let trail: Vec<String> = recs
            .iter()
            .filter(|r| {
                r.runbook.as_deref() == Some("ecc-dbe-drain")
                    || matches!(
                        r.kind,
                        RecordKind::HealthChanged | RecordKind::Escalation | RecordKind::TriggerSuppressed
                    )
            })
            .map(|r| format!("{:?} {}", r.kind, r.data.to_string().chars().take(300).collect::<String>()))
            .collect();
        panic!("the DBE did not drain gpu01: {}\n{}", slurm.show("gpu01"), trail.join("\n"))
    });
    let why = reason(&drained).unwrap_or_default();
    let run_id = engine
        .runs(&Default::default())
        .unwrap()
        .runs
        .into_iter()
        .find(|r| r.runbook == "ecc-dbe-drain")
        .map(|r| r.id)
        .unwrap();
    assert!(why.starts_with(&format!("nightshift: {run_id} repair: GPU 0")), "{drained}");
    assert!(why.contains("double-bit ECC"), "the reason names the fault: {drained}");

    // 5. Scale-in powers down only what nightshift powered up: gpu02.
    let (s, records) = run_group(&engine, "shrink").await;
    assert_eq!(s.outcome, Some(RunOutcome::Succeeded), "{s:?} {records:?}");
    let down = action_results(&records).into_iter().find(|r| r.data["op"] == "power_node").cloned();
    assert!(down.is_some_and(|r| r.data["applied"] == true), "{records:?}");
    let off = eventually(30, || {
        let log = std::fs::read_to_string(&power_log).unwrap_or_default();
        log.contains("suspend gpu02").then_some(())
    })
    .await;
    assert!(off.is_some(), "the SuspendProgram never ran: {}", slurm.ctld.log_text());
    let line = slurm.show("gpu02");
    assert!(line.contains("POWER"), "gpu02 is powering down: {line}");
    b.stop().await;

    assert!(engine.verify().unwrap().ok);
    c.close().await;
    // The "booted" slurmd went with the cluster.
    let conf = slurm.conf.clone();
    drop(slurm);
    assert!(processes_naming(&conf).is_empty(), "Slurm processes left running: {:?}", processes_naming(&conf));
}

async fn run_group(engine: &Engine, runbook: &str) -> (RunSummary, Vec<AuditRecord>) {
    let s = engine.submit(manual_run(runbook, Target::group("pool", "a"))).await.unwrap();
    let id = s.run().unwrap_or_else(|| panic!("{runbook} did not start: {s:?}")).id.clone();
    let summary = eventually(60, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some()))
        .await
        .unwrap_or_else(|| panic!("{runbook} did not end"));
    (summary, engine.run_records(&id).unwrap())
}

/// `nightshift fleet import` against the real Slurm: its node list piped in
/// from `scontrol --oneliner show nodes`, the host keys collected from the
/// agents over SSH. An agent that does not answer writes nothing (unless
/// --skip-unreachable), a host key that changed is refused (unless
/// --accept-changed), and what it writes is an inventory the engine loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_import_from_a_real_slurm() {
    let _serial = nightshift_tests::serial::module(module_path!());
    for (program, package) in
        [("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("scontrol", "slurm-client")]
    {
        if require(program, package).is_none() {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    // gpu02 and gpu03 are known to Slurm at their own loopback addresses;
    // only gpu02 runs an agent.
    let slurm = Slurm::start_with(
        &dir.path().join("slurm"),
        "NodeName=gpu02 NodeAddr=127.0.0.2 CPUs=1 RealMemory=100 State=UNKNOWN\n\
         NodeName=gpu03 NodeAddr=127.0.0.3 CPUs=1 RealMemory=100 State=UNKNOWN\n",
        "",
    );
    let port = free_port();
    let sim = SimConfig { gpus: 1, ..SimConfig::default() };
    let a = TestAgent::start_at(dir.path(), "gpu01", sim.clone(), "", &format!("127.0.0.1:{port}")).await;
    let mut b = TestAgent::start_at(dir.path(), "gpu02", sim.clone(), "", &format!("127.0.0.2:{port}")).await;
    let nodes = slurm.scontrol(&["--oneliner", "show", "nodes"]);
    assert!(nodes.status.success(), "{}", String::from_utf8_lossy(&nodes.stderr));
    let fleet = dir.path().join("fleet.yaml");
    let bin = nightshift_tests::external::workspace_bin_dir().join("nightshift");
    let import = |extra: &[&str]| {
        use std::io::Write;
        let mut child = Command::new(&bin)
            .args(["fleet", "import", "--slurm", "-", "--timeout-secs", "3", "--port", &port.to_string(), "--out"])
            .arg(&fleet)
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&nodes.stdout).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };

    // gpu03 has no agent: nothing is written.
    let (code, text) = import(&["--yes"]);
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("gpu03") && text.contains("unreachable"), "{text}");
    assert!(!fleet.exists(), "nothing written while an agent is missing");

    let (code, text) = import(&["--yes", "--skip-unreachable"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&a.fingerprint()) && text.contains(&b.fingerprint()), "every key is printed: {text}");
    let inv = nightshift_engine::embed::Inventory::load(&fleet).unwrap();
    let got: Vec<(&str, &str, &str, Option<&str>)> = inv
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.address.as_str(), n.host_key.as_str(), n.labels.get("pool").map(String::as_str)))
        .collect();
    assert_eq!(
        got,
        [
            ("gpu01", "127.0.0.1", a.fingerprint().as_str(), Some("gpu")),
            ("gpu02", "127.0.0.2", b.fingerprint().as_str(), Some("gpu"))
        ]
    );
    assert_eq!(inv.defaults.port, port);

    // gpu02 is reinstalled: a new host key. Refused until accepted.
    let old_key = b.fingerprint();
    b.stop().await;
    std::fs::remove_file(dir.path().join("gpu02/host_key")).unwrap();
    let b = TestAgent::start_at(dir.path(), "gpu02", sim, "", &format!("127.0.0.2:{port}")).await;
    assert_ne!(b.fingerprint(), old_key);
    let before = std::fs::read_to_string(&fleet).unwrap();
    let (code, text) = import(&["--yes", "--skip-unreachable"]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains(&format!("CHANGED (was {old_key})")), "{text}");
    assert_eq!(std::fs::read_to_string(&fleet).unwrap(), before, "a changed key writes nothing");
    let (code, text) = import(&["--yes", "--skip-unreachable", "--accept-changed"]);
    assert_eq!(code, Some(0), "{text}");
    let inv = nightshift_engine::embed::Inventory::load(&fleet).unwrap();
    assert_eq!(inv.nodes[1].host_key, b.fingerprint());

    // Imported again with the fabric's topology and a --label: each node's
    // leaf switch, and the label said now replaces the file's.
    let topo = dir.path().join("topology.conf");
    std::fs::write(
        &topo,
        "SwitchName=leaf1 Nodes=gpu[01-02]\nSwitchName=leaf2 Nodes=gpu03\nSwitchName=spine Switches=leaf[1-2]\n",
    )
    .unwrap();
    let topo = topo.display().to_string();
    let (code, text) = import(&["--yes", "--skip-unreachable", "--topology", &topo, "--label", "site=lab"]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = import(&["--yes", "--skip-unreachable", "--topology", &topo, "--label", "site=hall-b"]);
    assert_eq!(code, Some(0), "{text}");
    let inv = nightshift_engine::embed::Inventory::load(&fleet).unwrap();
    for n in &inv.nodes {
        assert_eq!(n.labels.get("switch").map(String::as_str), Some("leaf1"), "{n:?}");
        assert_eq!(n.labels.get("site").map(String::as_str), Some("hall-b"), "the newer --label: {n:?}");
    }
}

/// Issue 42 point 4, on the real Slurm: a pool with a job waiting and two
/// standbys — gpu02, powered down by Slurm's power saving and first in
/// fleet.yaml, and gpu03, up and drained by nightshift (a warm standby) —
/// grows by the warm one: the scale-out reads the queue, resumes gpu03 in
/// Slurm and powers nothing up (the ResumeProgram never runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slurm_scale_out_prefers_a_warm_standby() {
    let _serial = nightshift_tests::serial::module(module_path!());
    if !slurm_with_jobs_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("slurm");
    std::fs::create_dir_all(&sdir).unwrap();
    let power_log = sdir.join("power.log");
    // Power programs that only log: nothing may be powered up here.
    let (resume, suspend) = (power_script(&sdir, "resume", ""), power_script(&sdir, "suspend", ""));
    let (gpu02_port, gpu03_port) = (free_port(), free_port());
    let slurm = Slurm::start_with(
        &sdir,
        &format!(
            "NodeName=gpu02 NodeHostname={{host}} NodeAddr=127.0.0.1 Port={gpu02_port} CPUs=1 RealMemory=100 State=CLOUD\n\
             NodeName=gpu03 NodeHostname={{host}} NodeAddr=127.0.0.1 Port={gpu03_port} CPUs=1 RealMemory=100 State=UNKNOWN\n"
        ),
        &power_saving_conf(&resume, &suspend),
    );
    // gpu03's own slurmd: the warm standby is up.
    let _gpu03 = Daemon::start(
        &["slurmd".into(), "-D".into(), "-N".into(), "gpu03".into(), "-f".into(), slurm.conf.display().to_string()],
        &sdir.join("slurmd-gpu03.log"),
    );
    let up = eventually(60, || state(&slurm.show("gpu03")).starts_with("IDLE").then_some(())).await;
    assert!(up.is_some(), "gpu03 did not come up: {}", slurm.show("gpu03"));
    // Kept out of service by nightshift: the drain's reason is its own.
    let out = slurm.scontrol(&["update", "NodeName=gpu03", "State=DRAIN", "Reason=nightshift: r000000 standby"]);
    assert!(out.status.success(), "{out:?}");
    assert!(state(&slurm.show("gpu03")).contains("DRAIN"), "{}", slurm.show("gpu03"));

    let conf = slurm.conf.display().to_string();
    let sched = format!("scheduler: {{kind: slurm, slurm_conf: '{conf}', timeout_secs: 10}}\n");
    let sim = SimConfig { gpus: 1, ..SimConfig::default() };
    let a = TestAgent::start(dir.path(), "gpu01", sim.clone(), &sched).await;
    let mut b = TestAgent::start(dir.path(), "gpu02", sim.clone(), &sched).await;
    let c = TestAgent::start(dir.path(), "gpu03", sim, &sched).await;
    let (b_addr, c_addr) = (b.addr(), c.addr());
    let group_manifest = "trigger: {type: manual}\nscope: group\ncooldown_secs: 0\nmax_attempts_per_day: 100\n";
    let cfg = engine_setup(
        dir.path(),
        &[&a, &b, &c],
        &[(
            "grow",
            group_manifest,
            "let p = pool_pending();\nif p.known != true || p.jobs != 1 { fail(`the queue: ${p}`); }\nnote(`${p.jobs} job(s) waiting in the ${p.scheduler} queue, read by ${p.from}`);\nlet r = scale_out(1);\nif r.count == 0 { fail(`nothing to scale out: ${r.skipped}`); }\nnote(`scaled out by ${r.nodes}`);\nkeep_holds(3600);\n",
        )],
        "limits: {action_timeout_secs: 30}\n",
    );
    let fleet = std::fs::read_to_string(dir.path().join("fleet.yaml")).unwrap();
    let fleet = fleet
        .replace(
            &format!("  - name: gpu02\n    address: {b_addr}\n"),
            &format!("  - name: gpu02\n    standby: true\n    power_saving: true\n    address: {b_addr}\n"),
        )
        .replace(
            &format!("  - name: gpu03\n    address: {c_addr}\n"),
            &format!("  - name: gpu03\n    standby: true\n    address: {c_addr}\n"),
        );
    assert!(fleet.contains("power_saving: true") && fleet.matches("standby: true").count() == 2, "{fleet}");
    std::fs::write(dir.path().join("fleet.yaml"), fleet).unwrap();
    b.stop().await;
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let seen = eventually(30, || {
        let n = engine.node("gpu03").unwrap();
        (engine.node("gpu01").unwrap().state.connected && n.state.connected && n.state.drained).then_some(())
    })
    .await;
    assert!(seen.is_some(), "{:?}", engine.node("gpu03").unwrap().state);

    let held = Command::new("sbatch")
        .args(["--parsable", "--hold", "-p", "gpu", "--output", "/dev/null", "--wrap", "true"])
        .env("SLURM_CONF", &slurm.conf)
        .output()
        .unwrap();
    let held = String::from_utf8_lossy(&held.stdout).trim().to_string();
    assert!(!held.is_empty(), "sbatch --hold gave no job id");
    let s = engine.submit(manual_run("grow", Target::group("pool", "a"))).await.unwrap();
    let id = s.run().unwrap().id.clone();
    let done = eventually(60, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    let records = engine.run_records(&id).unwrap();
    assert_eq!(done.outcome, Some(RunOutcome::Succeeded), "{done:?} {records:?}");
    // What changed a node (the run's end renews the kept hold and releases
    // nothing else of it: below, gpu03 stays in service).
    let ops: Vec<(String, String)> = action_results(&records)
        .iter()
        .map(|r| (r.data["op"].as_str().unwrap_or("").to_string(), r.node.clone().unwrap_or_default()))
        .filter(|(op, _)| op != "renew" && op != "release")
        .collect();
    assert_eq!(ops, [("resume".to_string(), "gpu03".to_string())], "the warm standby, and nothing powered up");

    let said = |t: &str| records.iter().any(|r| r.data["text"].as_str().is_some_and(|x| x.contains(t)));
    assert!(said("1 job(s) waiting in the slurm queue, read by gpu01"), "{records:?}");
    assert!(said("scaled out by [\"gpu03\"]"), "{records:?}");
    let serving = eventually(30, || {
        let line = slurm.show("gpu03");
        (!state(&line).contains("DRAIN")).then_some(line)
    })
    .await;
    assert!(serving.is_some(), "gpu03 still drained in Slurm: {}", slurm.show("gpu03"));
    let log = std::fs::read_to_string(&power_log).unwrap_or_default();
    assert!(!log.contains("resume"), "nothing is powered up: {log}");
    // A CLOUD node Slurm never powered up is not even listed.
    let gpu02 = slurm.show("gpu02");
    assert!(gpu02.contains("not found") || gpu02.contains("POWER"), "gpu02 stays powered down: {gpu02}");

    let _ = Command::new("scancel").arg(&held).env("SLURM_CONF", &slurm.conf).output();
    assert!(engine.verify().unwrap().ok);
    let conf = slurm.conf.clone();
    drop(slurm);
    assert!(processes_naming(&conf).is_empty(), "Slurm processes left running: {:?}", processes_naming(&conf));
}
