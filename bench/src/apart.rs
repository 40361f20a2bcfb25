//! Sim agents in a process of their own (issue 45, item 2): scenario 2
//! measures the engine, so its agents — their SSH servers, journals and
//! fdatasyncs — run where agents live, outside the engine's process, and
//! each side's CPU time is read from `/proc`.
//!
//! The child is this binary started as `nightshift-bench --agent-fleet N
//! --agent-state DIR`: it starts N sim agents (state under `DIR/agents`,
//! the engine's key already in `DIR/authorized_keys`), prints one JSON
//! line per agent and then `ready`, answers each `stats` line on its stdin
//! with one JSON line, and stops its agents and exits when its stdin
//! closes — so it never outlives the bench, even one killed with -9.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::config::AgentConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::runtime::{self, StartedAgent};
use nightshift_proto::clock::{SharedClock, SystemClock};

/// One agent as the engine's inventory needs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub addr: String,
    pub fingerprint: String,
}

impl Member {
    /// How the engine reaches `agent`, named `name`.
    pub fn of(name: &str, agent: &StartedAgent) -> Member {
        Member {
            name: name.to_string(),
            addr: agent.server.local_addr.to_string(),
            fingerprint: agent.host_key_fingerprint.clone(),
        }
    }
}

/// What the agents did so far: their state log's fdatasyncs and the
/// changes they recorded (`pending` lines).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Counts {
    pub syncs: u64,
    pub changes: u64,
}

/// Start `n` sim agents (`gpus` each) with their state under
/// `dir/agents/<name>`, the keys allowed in `dir/authorized_keys`.
pub async fn start_agents(n: usize, gpus: u32, interval_ms: u64, dir: &Path) -> Result<Vec<(String, StartedAgent)>> {
    let clock: SharedClock = Arc::new(SystemClock);
    let mut agents = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("n{i:04}");
        let state = dir.join("agents").join(&name);
        let cfg = AgentConfig {
            telemetry_interval_ms: interval_ms,
            ..AgentConfig::sim_node(
                &name,
                &state,
                &dir.join("authorized_keys"),
                SimConfig { gpus, seed: i as u64, start_warm: false, ..SimConfig::default() },
            )
        };
        let backend: Arc<dyn Backend> = Arc::new(SimBackend::new(cfg.sim.clone())?);
        let s = runtime::start_with(&cfg, backend, clock.clone()).await?;
        agents.push((name, s));
    }
    Ok(agents)
}

/// The counts of agents in this process.
pub fn counts(agents: &[(String, StartedAgent)]) -> Counts {
    Counts {
        syncs: agents.iter().map(|(_, a)| a.agent.state_syncs()).sum(),
        changes: agents
            .iter()
            .map(|(_, a)| {
                a.agent.journal_lines().iter().filter(|l| matches!(l, JournalLine::Pending { .. })).count() as u64
            })
            .sum(),
    }
}

/// The runtime threads of a child serving `n` agents: one an agent, from
/// 2 up to 32. An agent journals a change with an `fdatasync` on the thread
/// that makes it; on a fleet each agent has its own machine, but on the
/// runtime's default (a thread a core, two here) one agent's sync would
/// hold up the requests of the others it shares a thread with — a wait no
/// fleet has, charged to the engine's latency.
pub fn worker_threads(n: usize) -> usize {
    n.clamp(2, 32)
}

/// The child's side: serve `n` agents until stdin closes.
pub async fn serve(n: usize, gpus: u32, interval_ms: u64, dir: &Path) -> Result<u8> {
    let agents = start_agents(n, gpus, interval_ms, dir).await?;
    let mut out = tokio::io::stdout();
    let mut text = String::new();
    for (name, a) in &agents {
        text.push_str(&serde_json::to_string(&Member::of(name, a))?);
        text.push('\n');
    }
    text.push_str("ready\n");
    out.write_all(text.as_bytes()).await?;
    out.flush().await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "stats" => {
                let mut reply = serde_json::to_string(&counts(&agents))?;
                reply.push('\n');
                out.write_all(reply.as_bytes()).await?;
                out.flush().await?;
            }
            other => return Err(anyhow!("agent fleet: expected `stats` or the end of input, found {other:?}")),
        }
    }
    for (_, a) in agents {
        a.shutdown().await;
    }
    Ok(0)
}

/// The bench's side of a child fleet.
pub struct ChildFleet {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pub members: Vec<Member>,
}

impl ChildFleet {
    /// Start `n` agents in a child process, state under `dir` (which holds
    /// `authorized_keys`); returns once every agent listens.
    pub async fn start(n: usize, gpus: u32, interval_ms: u64, dir: &Path) -> Result<ChildFleet> {
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(&exe)
            .args(["--agent-fleet", &n.to_string(), "--agent-gpus", &gpus.to_string()])
            .args(["--agent-interval-ms", &interval_ms.to_string(), "--agent-state"])
            .arg(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the agents' process {}", exe.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("the agents' process has no stdout"))?;
        let mut stdout = BufReader::new(stdout).lines();
        let mut members = Vec::with_capacity(n);
        let ready =
            async {
                while let Some(line) = stdout.next_line().await? {
                    if line == "ready" {
                        return Ok(());
                    }
                    members.push(serde_json::from_str::<Member>(&line).with_context(|| {
                        format!("the agents' process: expected an agent or `ready`, found {line:?}")
                    })?);
                }
                Err(anyhow!("the agents' process ended before it was ready"))
            };
        tokio::time::timeout(std::time::Duration::from_secs(120), ready)
            .await
            .map_err(|_| anyhow!("the agents' process was not ready in 120 s"))??;
        if members.len() != n {
            return Err(anyhow!("the agents' process: expected {n} agents, found {}", members.len()));
        }
        Ok(ChildFleet { child, stdin, stdout, members })
    }

    /// The agents' counts so far.
    pub async fn counts(&mut self) -> Result<Counts> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("the agents' process was stopped"))?;
        stdin.write_all(b"stats\n").await?;
        stdin.flush().await?;
        let line =
            self.stdout.next_line().await?.ok_or_else(|| anyhow!("the agents' process ended before it answered"))?;
        serde_json::from_str(&line).with_context(|| format!("the agents' process: expected its counts, found {line:?}"))
    }

    /// The child's CPU time so far, seconds.
    pub fn cpu_secs(&self) -> Result<f64> {
        let pid = self.child.id().ok_or_else(|| anyhow!("the agents' process has ended"))?;
        cpu_secs(&PathBuf::from(format!("/proc/{pid}/stat")))
    }

    /// Close its stdin and wait for it to stop its agents and exit.
    pub async fn shutdown(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(std::time::Duration::from_secs(30), self.child.wait())
            .await
            .map_err(|_| anyhow!("the agents' process did not exit 30 s after its input closed"))??;
        if status.success() { Ok(()) } else { Err(anyhow!("the agents' process failed: {status}")) }
    }
}

/// User plus system CPU seconds of a process or thread, from its `stat`
/// file under `/proc` (fields 14 and 15, in clock ticks of 1/100 s — Linux
/// fixes USER_HZ at 100 for user space).
pub fn cpu_secs(stat: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(stat).with_context(|| format!("reading {}", stat.display()))?;
    parse_cpu_secs(&text).ok_or_else(|| {
        anyhow!("{}: expected `pid (comm) state …` with utime and stime, found {:?}", stat.display(), text.trim())
    })
}

fn parse_cpu_secs(text: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after
    // the last `)`; there, field 3 (state) is the first.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// This process's CPU seconds, all threads.
pub fn process_cpu_secs() -> Result<f64> {
    cpu_secs(Path::new("/proc/self/stat"))
}

/// The calling thread's CPU seconds.
pub fn thread_cpu_secs() -> Result<f64> {
    cpu_secs(Path::new("/proc/thread-self/stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// utime and stime are fields 14 and 15, counted after the command
    /// name, whatever that name holds.
    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let line = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 12 0 0";
        assert_eq!(parse_cpu_secs(line), Some(3.25));
        assert_eq!(parse_cpu_secs("4242 (x) S 1 2"), None);
        assert_eq!(parse_cpu_secs("no name here"), None);
        assert!(process_cpu_secs().is_ok_and(|s| s >= 0.0));
        assert!(thread_cpu_secs().is_ok_and(|s| s >= 0.0));
    }
}
