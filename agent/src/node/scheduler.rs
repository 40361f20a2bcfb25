//! Drain and resume through the node's scheduler: Slurm (`scontrol`),
//! Kubernetes (`kubectl cordon`), or none (a state file on the node).
//!
//! The adapter only carries out and reads state; the ownership rule — resume
//! only what nightshift drained — is enforced by the agent service above it.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::NodeError;
use crate::procs;

/// Which scheduler owns the node's drain state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerConfig {
    /// No scheduler: drain state lives in a file in the agent's state dir.
    #[default]
    None,
    Slurm {
        /// The Slurm node name; the agent's node name when absent.
        #[serde(default)]
        node_name: Option<String>,
        #[serde(default = "scontrol")]
        scontrol_path: String,
        /// Slurm's configuration file, passed to `scontrol` as `SLURM_CONF`;
        /// Slurm's own default (`/etc/slurm/slurm.conf`) when absent.
        #[serde(default)]
        slurm_conf: Option<PathBuf>,
        #[serde(default = "ten")]
        timeout_secs: u64,
    },
    Kubernetes {
        #[serde(default)]
        node_name: Option<String>,
        #[serde(default = "kubectl")]
        kubectl_path: String,
        #[serde(default)]
        kubeconfig: Option<PathBuf>,
        #[serde(default = "ten")]
        timeout_secs: u64,
    },
}

fn scontrol() -> String {
    "scontrol".into()
}
fn kubectl() -> String {
    "kubectl".into()
}
fn ten() -> u64 {
    10
}

/// Annotation keys used on Kubernetes nodes.
pub const K8S_REASON_ANNOTATION: &str = "nightshift.io/drain-reason";
pub const K8S_BY_ANNOTATION: &str = "nightshift.io/drained-by";

/// The node's drain state as the scheduler reports it, with its marks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainState {
    pub drained: bool,
    pub reason: Option<String>,
    /// The `no_pack` mark is on (Slurm: the node's weight is
    /// [`NO_PACK_WEIGHT`]; Kubernetes: the `PreferNoSchedule` taint).
    #[serde(default)]
    pub no_pack: bool,
    /// The `quarantine` taint is on (Kubernetes).
    #[serde(default)]
    pub quarantine: bool,
    /// Slurm's node weight (the scheduler places work on the lowest first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// The Slurm node weight that marks a node `no_pack`: the highest weight
/// below Slurm's "infinite", so the scheduler places new work everywhere
/// else first.
pub const NO_PACK_WEIGHT: u32 = 65_000;

/// Kubernetes taint keys of the marks.
pub const K8S_NO_PACK_TAINT: &str = "nightshift.io/no-pack";
pub const K8S_QUARANTINE_TAINT: &str = "nightshift.io/quarantine";

/// A Slurm or Kubernetes node name: what may go into `NodeName=` or a
/// kubectl argument.
pub fn valid_node_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 253 && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `squeue` sits beside `scontrol` (a bare name: found on PATH).
fn squeue_beside(scontrol_path: &str) -> String {
    if scontrol_path.contains('/') {
        std::path::Path::new(scontrol_path).with_file_name("squeue").to_string_lossy().into_owned()
    } else {
        s("squeue")
    }
}

/// `squeue --format=%i|%D|%b` lines → (jobs, GPUs asked for): `%b` is
/// the job's GPUs per node (`gres/gpu:8`, `gres:gpu:a100:4`, `N/A`) times
/// its node count; a job that asks for none counts no GPU.
pub fn parse_pending(text: &str) -> (u64, u64) {
    let mut jobs = 0;
    let mut gpus = 0u64;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        jobs += 1;
        let mut f = line.split('|');
        let (_, nodes, tres) = (f.next(), f.next(), f.next().unwrap_or(""));
        let nodes: u64 = nodes.and_then(|n| n.trim().parse().ok()).unwrap_or(1);
        let per_node: u64 = tres
            .split(',')
            .filter(|t| t.contains("gpu"))
            .filter_map(|t| t.rsplit(':').next()?.trim().parse::<u64>().ok())
            .sum();
        gpus = gpus.saturating_add(per_node.saturating_mul(nodes));
    }
    (jobs, gpus)
}

/// The adapter.
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    node: String,
    state_file: PathBuf,
}

fn s(v: &str) -> String {
    v.to_string()
}

impl Scheduler {
    /// An adapter for `node`; `state_file` backs the `none` kind.
    pub fn new(config: SchedulerConfig, node: &str, state_file: PathBuf) -> Scheduler {
        let node = match &config {
            SchedulerConfig::Slurm { node_name: Some(n), .. }
            | SchedulerConfig::Kubernetes { node_name: Some(n), .. } => n.clone(),
            _ => node.to_string(),
        };
        Scheduler { config, node, state_file }
    }

    /// `none`, `slurm` or `kubernetes`.
    pub fn kind(&self) -> &'static str {
        match self.config {
            SchedulerConfig::None => "none",
            SchedulerConfig::Slurm { .. } => "slurm",
            SchedulerConfig::Kubernetes { .. } => "kubernetes",
        }
    }

    fn timeout(&self) -> Duration {
        match &self.config {
            SchedulerConfig::None => Duration::from_secs(5),
            SchedulerConfig::Slurm { timeout_secs, .. } | SchedulerConfig::Kubernetes { timeout_secs, .. } => {
                Duration::from_secs(*timeout_secs)
            }
        }
    }

    /// Environment added to helper processes.
    pub fn env(&self) -> Vec<(String, String)> {
        match &self.config {
            SchedulerConfig::Slurm { slurm_conf: Some(p), .. } => {
                vec![("SLURM_CONF".to_string(), p.display().to_string())]
            }
            _ => vec![],
        }
    }

    fn kubectl_base(&self) -> Vec<String> {
        match &self.config {
            SchedulerConfig::Kubernetes { kubectl_path, kubeconfig, .. } => {
                let mut v = vec![kubectl_path.clone()];
                if let Some(k) = kubeconfig {
                    v.push(format!("--kubeconfig={}", k.display()));
                }
                v
            }
            _ => vec![],
        }
    }

    /// The commands that read the drain state.
    pub fn state_argv(&self) -> Vec<String> {
        match &self.config {
            SchedulerConfig::None => vec![],
            SchedulerConfig::Slurm { scontrol_path, .. } => {
                vec![scontrol_path.clone(), s("--oneliner"), s("show"), s("node"), self.node.clone()]
            }
            SchedulerConfig::Kubernetes { .. } => {
                let mut v = self.kubectl_base();
                v.extend([s("get"), s("node"), self.node.clone(), s("-o"), s("json")]);
                v
            }
        }
    }

    /// The commands that drain with `reason`, in order.
    pub fn drain_argv(&self, reason: &str) -> Vec<Vec<String>> {
        match &self.config {
            SchedulerConfig::None => vec![],
            SchedulerConfig::Slurm { scontrol_path, .. } => vec![vec![
                scontrol_path.clone(),
                s("update"),
                format!("NodeName={}", self.node),
                s("State=DRAIN"),
                format!("Reason={reason}"),
            ]],
            SchedulerConfig::Kubernetes { .. } => {
                let mut cordon = self.kubectl_base();
                cordon.extend([s("cordon"), self.node.clone()]);
                let mut annotate = self.kubectl_base();
                annotate.extend([
                    s("annotate"),
                    s("node"),
                    self.node.clone(),
                    s("--overwrite"),
                    format!("{K8S_REASON_ANNOTATION}={reason}"),
                    format!("{K8S_BY_ANNOTATION}=nightshift"),
                ]);
                vec![annotate, cordon]
            }
        }
    }

    /// The commands that resume, in order.
    pub fn resume_argv(&self) -> Vec<Vec<String>> {
        match &self.config {
            SchedulerConfig::None => vec![],
            SchedulerConfig::Slurm { scontrol_path, .. } => {
                vec![vec![scontrol_path.clone(), s("update"), format!("NodeName={}", self.node), s("State=RESUME")]]
            }
            SchedulerConfig::Kubernetes { .. } => {
                let mut uncordon = self.kubectl_base();
                uncordon.extend([s("uncordon"), self.node.clone()]);
                let mut annotate = self.kubectl_base();
                annotate.extend([
                    s("annotate"),
                    s("node"),
                    self.node.clone(),
                    format!("{K8S_REASON_ANNOTATION}-"),
                    format!("{K8S_BY_ANNOTATION}-"),
                ]);
                vec![uncordon, annotate]
            }
        }
    }

    /// The commands that set (`set`) or clear a mark; `None` where the
    /// scheduler has no such mark (Slurm's quarantine is the drain itself).
    /// Clearing Slurm's `no_pack` puts `restore_weight` back.
    pub fn mark_argv(
        &self,
        mark: nightshift_proto::MarkKind,
        set: bool,
        reason: &str,
        restore_weight: u32,
    ) -> Option<Vec<Vec<String>>> {
        use nightshift_proto::MarkKind;
        let clean: String = reason
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .take(63)
            .collect();
        match (&self.config, mark) {
            (SchedulerConfig::None, _) => Some(vec![]),
            (SchedulerConfig::Slurm { scontrol_path, .. }, MarkKind::NoPack) => Some(vec![vec![
                scontrol_path.clone(),
                s("update"),
                format!("NodeName={}", self.node),
                format!("Weight={}", if set { NO_PACK_WEIGHT } else { restore_weight }),
            ]]),
            (SchedulerConfig::Slurm { .. }, MarkKind::Quarantine) => None,
            (SchedulerConfig::Kubernetes { .. }, m) => {
                let (key, effect) = match m {
                    MarkKind::NoPack => (K8S_NO_PACK_TAINT, "PreferNoSchedule"),
                    MarkKind::Quarantine => (K8S_QUARANTINE_TAINT, "NoSchedule"),
                };
                let mut v = self.kubectl_base();
                v.extend([s("taint"), s("nodes"), self.node.clone()]);
                if set {
                    v.push(format!("{key}={}:{effect}", if clean.is_empty() { "nightshift".into() } else { clean }));
                    v.push(s("--overwrite"));
                } else {
                    v.push(format!("{key}:{effect}-"));
                }
                Some(vec![v])
            }
        }
    }

    /// Set or clear a mark; `Ok(false)` where the scheduler has no such mark.
    pub async fn mark(&self, mark: nightshift_proto::MarkKind, set: bool, reason: &str) -> Result<bool, NodeError> {
        let restore = self.read_marks_file().map(|m| m.weight_before).unwrap_or(1);
        if set && let SchedulerConfig::Slurm { .. } = self.config {
            // Remember the weight to put back (not ours: a person's or the
            // site's).
            let st = self.state().await?;
            if let Some(w) = st.weight.filter(|w| *w != NO_PACK_WEIGHT) {
                self.write_marks_file(&MarksFile { weight_before: w, ..self.read_marks_file().unwrap_or_default() })?;
            }
        }
        let Some(cmds) = self.mark_argv(mark, set, reason, restore) else { return Ok(false) };
        if let SchedulerConfig::None = self.config {
            let mut f = self.read_marks_file().unwrap_or_default();
            match mark {
                nightshift_proto::MarkKind::NoPack => f.no_pack = set,
                nightshift_proto::MarkKind::Quarantine => f.quarantine = set,
            }
            self.write_marks_file(&f)?;
            return Ok(true);
        }
        for argv in cmds {
            procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        }
        Ok(true)
    }

    /// The command that powers `node` up or down through Slurm's power
    /// saving (`ResumeProgram` / `SuspendProgram` do the work); `None`
    /// where the scheduler has none.
    pub fn power_argv(&self, node: &str, up: bool) -> Option<Vec<String>> {
        match &self.config {
            SchedulerConfig::Slurm { scontrol_path, .. } => Some(vec![
                scontrol_path.clone(),
                s("update"),
                format!("NodeName={node}"),
                s(if up { "State=POWER_UP" } else { "State=POWER_DOWN" }),
            ]),
            _ => None,
        }
    }

    /// Power `node` up or down; `Ok(false)` where the scheduler has no
    /// power saving.
    pub async fn power(&self, node: &str, up: bool) -> Result<bool, NodeError> {
        if !valid_node_name(node) {
            return Err(NodeError::Unexpected(format!(
                "node name {node:?}: expected letters, digits, `-`, `_` or `.`"
            )));
        }
        let Some(argv) = self.power_argv(node, up) else { return Ok(false) };
        procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        Ok(true)
    }

    fn marks_file(&self) -> PathBuf {
        self.state_file.with_file_name("node-marks.json")
    }

    fn read_marks_file(&self) -> Option<MarksFile> {
        std::fs::read(self.marks_file()).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    fn write_marks_file(&self, f: &MarksFile) -> Result<(), NodeError> {
        let bytes = serde_json::to_vec_pretty(f).map_err(|e| NodeError::Io(e.to_string()))?;
        nightshift_proto::fsutil::write_atomic(&self.marks_file(), &bytes)
            .map_err(|e| NodeError::Io(format!("cannot write {}: {e}", self.marks_file().display())))
    }

    /// The command that lists the jobs running on the node (Slurm), whose
    /// ids the requeue then names.
    pub fn running_jobs_argv(&self) -> Option<Vec<String>> {
        match &self.config {
            SchedulerConfig::Slurm { scontrol_path, .. } => Some(vec![
                squeue_beside(scontrol_path),
                s("--noheader"),
                format!("--nodelist={}", self.node),
                s("--states=RUNNING"),
                s("--format=%A"),
            ]),
            _ => None,
        }
    }

    /// The command that lists the jobs waiting in the queue (Slurm: id,
    /// node count and GPUs per node), of `partition` or every partition.
    pub fn pending_argv(&self, partition: Option<&str>) -> Option<Vec<String>> {
        match &self.config {
            SchedulerConfig::Slurm { scontrol_path, .. } => {
                let mut argv =
                    vec![squeue_beside(scontrol_path), s("--noheader"), s("--states=PENDING"), s("--format=%i|%D|%b")];
                if let Some(p) = partition {
                    argv.push(format!("--partition={p}"));
                }
                Some(argv)
            }
            _ => None,
        }
    }

    /// The jobs waiting in the queue and the GPUs they ask for (`None`:
    /// this scheduler cannot say).
    pub async fn pending(&self, partition: Option<&str>) -> Result<Option<(u64, u64)>, NodeError> {
        if let Some(p) = partition
            && !valid_node_name(p)
        {
            return Err(NodeError::Unexpected(format!("partition {p:?}: expected letters, digits, `-`, `_` or `.`")));
        }
        let Some(argv) = self.pending_argv(partition) else { return Ok(None) };
        let out = procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        Ok(Some(parse_pending(&out.stdout)))
    }

    /// The commands that move the node's running jobs elsewhere: Slurm
    /// requeues `jobs` (from [`Scheduler::running_jobs_argv`]); Kubernetes
    /// evicts the node's pods (`kubectl drain`, which cordons too).
    pub fn requeue_argv(&self, jobs: &[String]) -> Vec<Vec<String>> {
        match &self.config {
            SchedulerConfig::None => vec![],
            SchedulerConfig::Slurm { scontrol_path, .. } => {
                if jobs.is_empty() {
                    return vec![];
                }
                vec![vec![scontrol_path.clone(), s("requeue"), jobs.join(",")]]
            }
            SchedulerConfig::Kubernetes { .. } => {
                let mut drain = self.kubectl_base();
                drain.extend([
                    s("drain"),
                    self.node.clone(),
                    s("--ignore-daemonsets"),
                    s("--delete-emptydir-data"),
                    s("--timeout=120s"),
                ]);
                vec![drain]
            }
        }
    }

    /// Move the running jobs off the node; returns what was moved (Slurm job
    /// ids; `pods` for Kubernetes; nothing with no scheduler).
    pub async fn requeue(&self) -> Result<Vec<String>, NodeError> {
        let jobs = match self.running_jobs_argv() {
            Some(argv) => {
                let out = procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
                out.stdout
                    .split_whitespace()
                    .filter(|j| j.chars().all(|c| c.is_ascii_digit() || c == '_'))
                    .map(str::to_string)
                    .collect()
            }
            None => Vec::new(),
        };
        for argv in self.requeue_argv(&jobs) {
            procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        }
        Ok(match &self.config {
            SchedulerConfig::Kubernetes { .. } => vec![s("pods")],
            _ => jobs,
        })
    }

    /// Read the drain state and marks.
    pub async fn state(&self) -> Result<DrainState, NodeError> {
        match &self.config {
            SchedulerConfig::None => {
                let mut st = self.read_file()?;
                let m = self.read_marks_file().unwrap_or_default();
                st.no_pack = m.no_pack;
                st.quarantine = m.quarantine;
                Ok(st)
            }
            SchedulerConfig::Slurm { .. } => {
                let out = procs::run_with_env(&self.state_argv(), &self.env(), self.timeout()).await?;
                parse_slurm_node(&out.stdout)
            }
            SchedulerConfig::Kubernetes { .. } => {
                let out = procs::run_with_env(&self.state_argv(), &self.env(), self.timeout()).await?;
                parse_k8s_node(&out.stdout)
            }
        }
    }

    /// Drain the node with `reason`.
    pub async fn drain(&self, reason: &str) -> Result<(), NodeError> {
        if let SchedulerConfig::None = self.config {
            return self.write_file(&DrainState {
                drained: true,
                reason: Some(reason.to_string()),
                ..DrainState::default()
            });
        }
        for argv in self.drain_argv(reason) {
            procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        }
        Ok(())
    }

    /// Return the node to service.
    pub async fn resume(&self) -> Result<(), NodeError> {
        if let SchedulerConfig::None = self.config {
            return self.write_file(&DrainState::default());
        }
        for argv in self.resume_argv() {
            procs::run_with_env(&argv, &self.env(), self.timeout()).await?;
        }
        Ok(())
    }

    /// Simulation and tests: a person drains the node (only for `none`).
    pub fn person_drain(&self, reason: &str) -> Result<(), NodeError> {
        match self.config {
            SchedulerConfig::None => self.write_file(&DrainState {
                drained: true,
                reason: Some(reason.to_string()),
                ..DrainState::default()
            }),
            _ => Err(NodeError::Unexpected(format!(
                "person_drain is only simulated with the `none` scheduler; use {} directly",
                self.kind()
            ))),
        }
    }

    /// Simulation and tests: a person resumes the node (only for `none`).
    pub fn person_resume(&self) -> Result<(), NodeError> {
        match self.config {
            SchedulerConfig::None => self.write_file(&DrainState::default()),
            _ => Err(NodeError::Unexpected(format!(
                "person_resume is only simulated with the `none` scheduler; use {} directly",
                self.kind()
            ))),
        }
    }

    fn read_file(&self) -> Result<DrainState, NodeError> {
        match std::fs::read(&self.state_file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                NodeError::Io(format!("drain state file {} is not valid: {e}", self.state_file.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DrainState::default()),
            Err(e) => Err(NodeError::Io(format!("cannot read {}: {e}", self.state_file.display()))),
        }
    }

    fn write_file(&self, state: &DrainState) -> Result<(), NodeError> {
        let state = DrainState { drained: state.drained, reason: state.reason.clone(), ..DrainState::default() };
        let bytes = serde_json::to_vec_pretty(&state).map_err(|e| NodeError::Io(e.to_string()))?;
        nightshift_proto::fsutil::write_atomic(&self.state_file, &bytes)
            .map_err(|e| NodeError::Io(format!("cannot write {}: {e}", self.state_file.display())))
    }
}

/// What the agent remembers about the marks it set (the `none` scheduler's
/// marks, and the Slurm weight a `no_pack` mark replaced).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MarksFile {
    #[serde(default)]
    no_pack: bool,
    #[serde(default)]
    quarantine: bool,
    #[serde(default = "one")]
    weight_before: u32,
}

fn one() -> u32 {
    1
}

impl Default for MarksFile {
    fn default() -> Self {
        MarksFile { no_pack: false, quarantine: false, weight_before: 1 }
    }
}

/// Parse `scontrol --oneliner show node` output.
pub fn parse_slurm_node(out: &str) -> Result<DrainState, NodeError> {
    let line = out.lines().find(|l| l.contains("NodeName=")).ok_or_else(|| {
        NodeError::Unexpected(format!(
            "scontrol printed no NodeName= line: expected a node record, found {:?}",
            out.chars().take(200).collect::<String>()
        ))
    })?;
    let state = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("State="))
        .ok_or_else(|| NodeError::Unexpected("scontrol output has no State= field".into()))?;
    let drained = state.split('+').any(|s| matches!(s, "DRAIN" | "DRAINED" | "DRAINING" | "DOWN" | "FAIL"));
    // Reason= runs to the end of the line in one-liner output, followed by
    // " [user@time]".
    let reason = line.find(" Reason=").map(|i| {
        let r = &line[i + " Reason=".len()..];
        let r = match r.rfind(" [") {
            Some(j) if r.ends_with(']') => &r[..j],
            _ => r,
        };
        r.trim().to_string()
    });
    let reason = reason.filter(|r| !r.is_empty() && r != "(null)");
    let weight = line.split_whitespace().find_map(|f| f.strip_prefix("Weight=")).and_then(|w| w.parse().ok());
    Ok(DrainState { drained, reason, no_pack: weight == Some(NO_PACK_WEIGHT), quarantine: false, weight })
}

/// Parse `kubectl get node -o json` output.
pub fn parse_k8s_node(out: &str) -> Result<DrainState, NodeError> {
    let v: serde_json::Value =
        serde_json::from_str(out).map_err(|e| NodeError::Unexpected(format!("kubectl printed invalid JSON: {e}")))?;
    let drained = v.pointer("/spec/unschedulable").and_then(|b| b.as_bool()).unwrap_or(false);
    let reason = v
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(K8S_REASON_ANNOTATION))
        .and_then(|r| r.as_str())
        .map(str::to_string);
    let reason = match (drained, reason) {
        (true, None) => Some("cordoned without a nightshift annotation".to_string()),
        (_, r) => r,
    };
    let taints = v.pointer("/spec/taints").and_then(|t| t.as_array()).cloned().unwrap_or_default();
    let has = |key: &str| taints.iter().any(|t| t.get("key").and_then(|k| k.as_str()) == Some(key));
    Ok(DrainState {
        drained,
        reason,
        no_pack: has(K8S_NO_PACK_TAINT),
        quarantine: has(K8S_QUARANTINE_TAINT),
        weight: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_jobs_and_the_gpus_they_ask_for() {
        for (text, want) in [
            ("", (0, 0)),
            ("17|1|N/A\n", (1, 0)),
            ("17|2|gres/gpu:8\n18|1|gres:gpu:a100:4\n", (2, 20)),
            ("19|1|gres/gpu:2,gres/shard:1\n  \n", (1, 2)),
            ("20|x|gres/gpu:8\n", (1, 8)),
        ] {
            assert_eq!(parse_pending(text), want, "{text:?}");
        }
    }

    fn slurm() -> Scheduler {
        Scheduler::new(
            SchedulerConfig::Slurm {
                node_name: Some("gpu01".into()),
                scontrol_path: "scontrol".into(),
                slurm_conf: Some("/etc/slurm/lab.conf".into()),
                timeout_secs: 5,
            },
            "ignored",
            PathBuf::from("/nonexistent"),
        )
    }

    fn k8s() -> Scheduler {
        Scheduler::new(
            SchedulerConfig::Kubernetes {
                node_name: None,
                kubectl_path: "kubectl".into(),
                kubeconfig: Some("/etc/k.conf".into()),
                timeout_secs: 5,
            },
            "gpu02",
            PathBuf::from("/nonexistent"),
        )
    }

    #[test]
    fn slurm_commands_are_exact() {
        assert_eq!(
            slurm().drain_argv("nightshift: r1 too hot"),
            vec![vec!["scontrol", "update", "NodeName=gpu01", "State=DRAIN", "Reason=nightshift: r1 too hot"]]
        );
        assert_eq!(slurm().resume_argv(), vec![vec!["scontrol", "update", "NodeName=gpu01", "State=RESUME"]]);
        assert_eq!(slurm().state_argv(), vec!["scontrol", "--oneliner", "show", "node", "gpu01"]);
        assert_eq!(slurm().env(), vec![("SLURM_CONF".to_string(), "/etc/slurm/lab.conf".to_string())]);
        assert!(k8s().env().is_empty());
        // Requeue: list the node's running jobs, then requeue those ids.
        assert_eq!(
            slurm().running_jobs_argv(),
            Some(vec![
                "squeue".to_string(),
                "--noheader".into(),
                "--nodelist=gpu01".into(),
                "--states=RUNNING".into(),
                "--format=%A".into()
            ])
        );
        assert_eq!(
            slurm().requeue_argv(&["1201".into(), "1207".into()]),
            vec![vec!["scontrol", "requeue", "1201,1207"]]
        );
        assert!(slurm().requeue_argv(&[]).is_empty(), "no running job, nothing to requeue");
        assert_eq!(
            k8s().requeue_argv(&[]),
            vec![vec![
                "kubectl",
                "--kubeconfig=/etc/k.conf",
                "drain",
                "gpu02",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=120s"
            ]]
        );
    }

    #[test]
    fn mark_and_power_commands_are_exact() {
        use nightshift_proto::MarkKind;
        assert_eq!(
            slurm().mark_argv(MarkKind::NoPack, true, "memory", 1),
            Some(vec![vec!["scontrol".to_string(), "update".into(), "NodeName=gpu01".into(), "Weight=65000".into()]])
        );
        assert_eq!(
            slurm().mark_argv(MarkKind::NoPack, false, "", 20),
            Some(vec![vec!["scontrol".to_string(), "update".into(), "NodeName=gpu01".into(), "Weight=20".into()]])
        );
        assert_eq!(slurm().mark_argv(MarkKind::Quarantine, true, "xid", 1), None, "Slurm's quarantine is the drain");
        assert_eq!(
            k8s().mark_argv(MarkKind::Quarantine, true, "xid 79 r12", 1),
            Some(vec![vec![
                "kubectl".to_string(),
                "--kubeconfig=/etc/k.conf".into(),
                "taint".into(),
                "nodes".into(),
                "gpu02".into(),
                "nightshift.io/quarantine=xid_79_r12:NoSchedule".into(),
                "--overwrite".into()
            ]])
        );
        assert_eq!(
            k8s().mark_argv(MarkKind::NoPack, false, "", 1),
            Some(vec![vec![
                "kubectl".to_string(),
                "--kubeconfig=/etc/k.conf".into(),
                "taint".into(),
                "nodes".into(),
                "gpu02".into(),
                "nightshift.io/no-pack:PreferNoSchedule-".into()
            ]])
        );
        assert_eq!(
            slurm().power_argv("gpu07", true),
            Some(vec!["scontrol".to_string(), "update".into(), "NodeName=gpu07".into(), "State=POWER_UP".into()])
        );
        assert_eq!(k8s().power_argv("gpu07", false), None);
        for bad in ["", "a b", "x;rm", "../x", "n\nm"] {
            assert!(!valid_node_name(bad), "{bad:?}");
        }
        let weighted = parse_slurm_node("NodeName=gpu01 State=IDLE Weight=65000 CPUTot=1").unwrap();
        assert!(weighted.no_pack && weighted.weight == Some(65000));
        let tainted = parse_k8s_node(
            r#"{"spec":{"taints":[{"key":"nightshift.io/quarantine","value":"x","effect":"NoSchedule"}]},"metadata":{}}"#,
        )
        .unwrap();
        assert!(tainted.quarantine && !tainted.no_pack);
    }

    #[test]
    fn kubernetes_commands_are_exact() {
        assert_eq!(
            k8s().drain_argv("nightshift: r2 ecc"),
            vec![
                vec![
                    "kubectl",
                    "--kubeconfig=/etc/k.conf",
                    "annotate",
                    "node",
                    "gpu02",
                    "--overwrite",
                    "nightshift.io/drain-reason=nightshift: r2 ecc",
                    "nightshift.io/drained-by=nightshift"
                ],
                vec!["kubectl", "--kubeconfig=/etc/k.conf", "cordon", "gpu02"],
            ]
        );
        assert_eq!(
            k8s().resume_argv(),
            vec![
                vec!["kubectl", "--kubeconfig=/etc/k.conf", "uncordon", "gpu02"],
                vec![
                    "kubectl",
                    "--kubeconfig=/etc/k.conf",
                    "annotate",
                    "node",
                    "gpu02",
                    "nightshift.io/drain-reason-",
                    "nightshift.io/drained-by-"
                ],
            ]
        );
    }

    #[test]
    fn parses_slurm_states() {
        let cases = [
            ("NodeName=gpu01 Arch=x86_64 State=IDLE ThreadsPerCore=1", false, None),
            (
                "NodeName=gpu01 State=IDLE+DRAIN CPUTot=8 Reason=nightshift: r1 hot [root@2026-11-30T01:00:00]",
                true,
                Some("nightshift: r1 hot"),
            ),
            (
                "NodeName=gpu01 State=MIXED+DRAIN Reason=fan swap by dave [dave@2026-11-29T22:00:00]",
                true,
                Some("fan swap by dave"),
            ),
            (
                "NodeName=gpu01 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-30T00:00:00]",
                true,
                Some("Not responding"),
            ),
        ];
        for (line, drained, reason) in cases {
            let st = parse_slurm_node(line).unwrap();
            assert_eq!(st.drained, drained, "{line}");
            assert_eq!(st.reason.as_deref(), reason, "{line}");
        }
        assert!(parse_slurm_node("Node gpu9 not found").is_err());
    }

    #[test]
    fn parses_kubernetes_states() {
        let ours = r#"{"spec":{"unschedulable":true},"metadata":{"annotations":{"nightshift.io/drain-reason":"nightshift: r3 xid 79"}}}"#;
        assert_eq!(
            parse_k8s_node(ours).unwrap(),
            DrainState { drained: true, reason: Some("nightshift: r3 xid 79".into()), ..DrainState::default() }
        );
        let theirs = r#"{"spec":{"unschedulable":true},"metadata":{}}"#;
        let st = parse_k8s_node(theirs).unwrap();
        assert!(st.drained && !nightshift_proto::owner::owned_by_nightshift(st.reason.as_deref()));
        let free = r#"{"spec":{},"metadata":{}}"#;
        assert_eq!(parse_k8s_node(free).unwrap(), DrainState::default());
    }
}
