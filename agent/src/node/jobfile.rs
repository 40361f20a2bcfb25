//! Job-level readings from a textfile directory: the contract between a
//! training job and the agent, as node_exporter's textfile collector does
//! it. A job writes one file per job (`<anything>.prom`, replaced
//! atomically: write a temp file, rename) in the Prometheus text format:
//!
//! ```text
//! nightshift_job_progress 1234                       # steps done (a counter)
//! nightshift_gpu_mem_fragmentation_pct{gpu="1"} 28.5 # inactive split bytes / reserved (else 1 − allocated/reserved)
//! nightshift_gpu_mem_peak_allocated_pct{gpu="1"} 71  # peak allocated / total: the job's real need
//! nightshift_job_oom_events_total 0                  # out-of-memory errors caught (a counter)
//! nightshift_comm_overhead_pct 34                    # all-reduce share of step time
//! nightshift_allreduce_p99_ms 8.5
//! nightshift_nvlink_p2p_latency_us 4.7
//! ```
//!
//! and, from a heartbeat thread outside the training loop (its own file,
//! `<job>.heartbeat.prom`, so a hung loop's readings go stale while the
//! heartbeat goes on):
//!
//! ```text
//! nightshift_job_heartbeat_timestamp_seconds 1790000123.4   # now
//! nightshift_job_last_progress_timestamp_seconds 1790000001 # when the loop last advanced
//! nightshift_job_world_size 16                               # GPUs in the job, across nodes
//! ```
//!
//! Files older than `max_age_secs` are ignored (a job that died stops
//! speaking; a hung loop's progress file too). Readings from several files
//! combine: progress adds up, the rest take the worst (highest) value —
//! the stall of the most stuck job, the largest world size. A heartbeat
//! counts its job as running. These readings take the place of the
//! backend's: the job knows its allocator and its collectives.
//! `examples/pytorch/nightshift_textfile.py` writes such a file from a
//! PyTorch training loop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nightshift_proto::exposition::{self, Sample, escape};
use nightshift_proto::{GpuTelemetry, NodeTelemetry};

/// The readings of a textfile directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobReadings {
    pub progress: Option<f64>,
    pub fragmentation_pct: BTreeMap<u32, f64>,
    pub peak_allocated_pct: BTreeMap<u32, f64>,
    pub oom_events: Option<f64>,
    pub comm_overhead_pct: Option<f64>,
    pub allreduce_p99_ms: Option<f64>,
    pub p2p_latency_us: Option<f64>,
    /// Jobs whose heartbeat is fresh.
    pub jobs_running: u32,
    /// Seconds since the most stuck job last advanced.
    pub stalled_secs: Option<f64>,
    pub world_size: Option<u32>,
    /// `(file, line, why)` for lines that were not understood.
    pub rejected: Vec<(PathBuf, usize, String)>,
}

/// The fresh `*.prom` files of `dir`, in name order.
fn fresh_files(dir: &Path, max_age: Duration, now: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() <= max_age)
        })
        .collect();
    files.sort();
    files
}

/// Labels a job may not set on the series it exports: the ones that say
/// which node (or scrape target) a reading is from.
const HOST_LABELS: &[&str] = &["Hostname", "hostname", "instance", "node"];

/// The jobs' own `nightshift_*` series of the fresh files in `dir`, as the
/// agent's exporter serves them: `Hostname` set to `node` by the agent —
/// a job's own `Hostname`, `hostname`, `instance`, `node` and `exported_*`
/// labels dropped — so no label a job writes can make a reading (and the
/// alert and drain it may lead to) another node's (issue 46 point 10).
/// Timestamps are dropped; a line not understood is left out; a series
/// two files both hold is served once (the first file's).
pub fn exported_series(dir: &Path, max_age: Duration, now: SystemTime, node: &str) -> String {
    use std::fmt::Write as _;
    let mut by_name: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for f in fresh_files(dir, max_age, now) {
        if std::fs::metadata(&f).map_or(true, |m| m.len() > 1 << 20) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("nightshift_")) {
            let Ok(Sample { name, labels, value, .. }) = exposition::parse_line(line) else { continue };
            let mut l = format!("Hostname=\"{}\"", escape(node));
            for (k, v) in
                labels.iter().filter(|(k, _)| !HOST_LABELS.contains(&k.as_str()) && !k.starts_with("exported_"))
            {
                let _ = write!(l, ",{k}=\"{}\"", escape(v));
            }
            by_name.entry(name).or_default().entry(l).or_insert(value);
        }
    }
    let mut out = String::new();
    for (name, series) in by_name {
        let _ = writeln!(out, "# HELP {name} A job's own reading (job_metrics_dir), labelled by the agent.");
        let _ = writeln!(out, "# TYPE {name} untyped");
        for (l, v) in series {
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
    }
    out
}

/// Read every fresh `*.prom` file in `dir`.
pub fn read_dir(dir: &Path, max_age: Duration, now: SystemTime) -> JobReadings {
    let mut r = JobReadings::default();
    for f in fresh_files(dir, max_age, now) {
        // A file over 1 MiB is not a job's few readings.
        let text = match std::fs::metadata(&f) {
            Ok(m) if m.len() <= 1 << 20 => std::fs::read_to_string(&f).unwrap_or_default(),
            _ => {
                r.rejected.push((f.clone(), 0, "larger than 1 MiB".into()));
                continue;
            }
        };
        let now_secs = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        parse_into_at(&text, &f, &mut r, now_secs);
    }
    r
}

fn worst(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.map_or(v, |s| s.max(v)));
}

/// Parse one file's text into `r` (heartbeats measured against the wall
/// clock now).
pub fn parse_into(text: &str, file: &Path, r: &mut JobReadings) {
    let now = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    parse_into_at(text, file, r, now)
}

/// [`parse_into`], with `now_secs` the time (UNIX seconds) heartbeats are
/// measured against.
pub fn parse_into_at(text: &str, file: &Path, r: &mut JobReadings, now_secs: f64) {
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut reject = |why: String| r.rejected.push((file.to_path_buf(), i + 1, why));
        let s = match exposition::parse_line(line) {
            Ok(s) => s,
            Err(e) => {
                reject(e.to_string());
                continue;
            }
        };
        let v = s.value;
        if !v.is_finite() {
            reject(format!("expected a finite number, found {v}"));
            continue;
        }
        let gpu = s.labels.get("gpu").and_then(|g| g.parse::<u32>().ok());
        let name = s.name.as_str();
        match name {
            "nightshift_job_progress" => r.progress = Some(r.progress.unwrap_or(0.0) + v),
            "nightshift_gpu_mem_fragmentation_pct" => match gpu {
                Some(g) if (0.0..=100.0).contains(&v) => {
                    let e = r.fragmentation_pct.entry(g).or_insert(v);
                    *e = e.max(v);
                }
                Some(_) => reject(format!("fragmentation: expected 0 to 100, found {v}")),
                None => reject("nightshift_gpu_mem_fragmentation_pct needs a gpu=\"N\" label".into()),
            },
            "nightshift_gpu_mem_peak_allocated_pct" => match gpu {
                Some(g) if (0.0..=100.0).contains(&v) => {
                    let e = r.peak_allocated_pct.entry(g).or_insert(v);
                    *e = e.max(v);
                }
                Some(_) => reject(format!("peak allocated: expected 0 to 100, found {v}")),
                None => reject("nightshift_gpu_mem_peak_allocated_pct needs a gpu=\"N\" label".into()),
            },
            "nightshift_job_oom_events_total" if v >= 0.0 => r.oom_events = Some(r.oom_events.unwrap_or(0.0) + v),
            "nightshift_job_oom_events_total" => reject(format!("oom events: expected 0 or more, found {v}")),
            "nightshift_comm_overhead_pct" => worst(&mut r.comm_overhead_pct, v),
            "nightshift_allreduce_p99_ms" => worst(&mut r.allreduce_p99_ms, v),
            "nightshift_nvlink_p2p_latency_us" => worst(&mut r.p2p_latency_us, v),
            "nightshift_job_heartbeat_timestamp_seconds" => r.jobs_running += 1,
            "nightshift_job_last_progress_timestamp_seconds" => {
                worst(&mut r.stalled_secs, (now_secs - v).max(0.0).floor())
            }
            "nightshift_job_world_size" if (1.0..=1_000_000.0).contains(&v) => {
                r.world_size = Some(r.world_size.unwrap_or(0).max(v as u32));
            }
            "nightshift_job_world_size" => reject(format!("world size: expected 1 to 1000000, found {v}")),
            other => reject(format!("unknown reading `{other}`")),
        }
    }
}

impl JobReadings {
    /// Put the readings over the backend's.
    pub fn apply(&self, gpus: &mut [GpuTelemetry], node: &mut NodeTelemetry) {
        for g in gpus.iter_mut() {
            if let Some(f) = self.fragmentation_pct.get(&g.index) {
                g.mem_fragmentation_pct = Some(*f);
            }
            if let Some(p) = self.peak_allocated_pct.get(&g.index) {
                g.mem_peak_allocated_pct = Some(*p);
            }
        }
        if let Some(n) = self.oom_events {
            node.job_oom_events_total = Some(n.min(u64::MAX as f64) as u64);
        }
        if self.progress.is_some() {
            node.job_progress = self.progress;
        }
        if self.comm_overhead_pct.is_some() {
            node.comm_overhead_pct = self.comm_overhead_pct;
        }
        if self.allreduce_p99_ms.is_some() {
            node.allreduce_p99_ms = self.allreduce_p99_ms;
        }
        if self.p2p_latency_us.is_some() {
            node.nvlink_p2p_latency_us = self.p2p_latency_us;
        }
        if self.jobs_running > 0 {
            node.jobs_running = Some(self.jobs_running);
            node.job_stalled_secs = self.stalled_secs;
            node.job_world_size = self.world_size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's file is read as Prometheus reads it (one reader for the
    /// workspace): quoted label values may hold commas, blanks and escapes, and a
    /// sample may carry a timestamp — the value is the value, not the time.
    #[test]
    fn lines_are_read_as_the_text_format_says() {
        let mut r = JobReadings::default();
        let text = "nightshift_gpu_mem_fragmentation_pct{job=\"a,\\\"b\\\" c\",gpu=\"2\"} 12 1790000000000\n\
                    nightshift_comm_overhead_pct{job=\"x y\"} 34\n\
                    nightshift_job_progress 5 x\n";
        parse_into_at(text, Path::new("job.prom"), &mut r, 0.0);
        assert_eq!(r.fragmentation_pct.get(&2), Some(&12.0), "{:?}", r.rejected);
        assert_eq!(r.comm_overhead_pct, Some(34.0));
        let why: Vec<&str> = r.rejected.iter().map(|(_, _, w)| w.as_str()).collect();
        assert_eq!(
            why,
            vec!["expected `name{label=\"value\",…} value [timestamp]`, found \"nightshift_job_progress 5 x\""]
        );
    }

    #[test]
    fn files_combine_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("job-a.prom"),
            "# HELP …\nnightshift_job_progress 100\nnightshift_gpu_mem_fragmentation_pct{gpu=\"1\"} 28.5\nnightshift_comm_overhead_pct 12\nnightshift_gpu_mem_peak_allocated_pct{gpu=\"1\"} 71\nnightshift_job_oom_events_total 2\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("job-b.prom"),
            "nightshift_job_progress 50\nnightshift_comm_overhead_pct 34\nnightshift_gpu_mem_fragmentation_pct 3\nnightshift_comm_overhead_pct NaN\nbogus_metric 1\nnightshift_gpu_mem_peak_allocated_pct{gpu=\"1\"} 140\nnightshift_job_oom_events_total 1\nnightshift_job_oom_events_total -1\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "nightshift_job_progress 999\n").unwrap();
        let r = read_dir(dir.path(), Duration::from_secs(60), SystemTime::now());
        assert_eq!(r.progress, Some(150.0));
        assert_eq!(r.fragmentation_pct.get(&1), Some(&28.5));
        assert_eq!(r.comm_overhead_pct, Some(34.0), "the worst of the jobs");
        assert_eq!(r.peak_allocated_pct.get(&1), Some(&71.0));
        assert_eq!(r.oom_events, Some(3.0), "the jobs' counters add up");
        let why: Vec<(usize, &str)> = r.rejected.iter().map(|(_, l, w)| (*l, w.as_str())).collect();
        assert_eq!(
            why,
            vec![
                (3, "nightshift_gpu_mem_fragmentation_pct needs a gpu=\"N\" label"),
                (4, "expected a finite number, found NaN"),
                (5, "unknown reading `bogus_metric`"),
                (6, "peak allocated: expected 0 to 100, found 140"),
                (8, "oom events: expected 0 or more, found -1")
            ]
        );
        // A job that stopped writing is ignored after max_age.
        let later = SystemTime::now() + Duration::from_secs(120);
        assert_eq!(read_dir(dir.path(), Duration::from_secs(60), later).progress, None);
        // Applied over the backend's readings.
        let mut gpus = vec![GpuTelemetry { index: 1, mem_fragmentation_pct: Some(2.0), ..Default::default() }];
        let mut node = NodeTelemetry::default();
        r.apply(&mut gpus, &mut node);
        assert_eq!(gpus[0].mem_fragmentation_pct, Some(28.5));
        assert_eq!((node.job_progress, node.comm_overhead_pct), (Some(150.0), Some(34.0)));
    }

    /// A hung loop stops writing; its heartbeat says since when. Two jobs:
    /// the worse one's stall shows (a sum would hide it).
    #[test]
    fn heartbeats_give_the_worst_stall_and_the_world_size() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let t = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        std::fs::write(
            dir.path().join("a.heartbeat.prom"),
            format!("nightshift_job_heartbeat_timestamp_seconds {t}\nnightshift_job_last_progress_timestamp_seconds {}\nnightshift_job_world_size 16\n", t - 2.0),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.heartbeat.prom"),
            format!("nightshift_job_heartbeat_timestamp_seconds {t}\nnightshift_job_last_progress_timestamp_seconds {}\nnightshift_job_world_size 8\n", t - 900.0),
        )
        .unwrap();
        let r = read_dir(dir.path(), Duration::from_secs(120), now);
        assert_eq!((r.jobs_running, r.world_size), (2, Some(16)));
        assert!(r.stalled_secs.is_some_and(|s| (899.0..=901.0).contains(&s)), "{:?}", r.stalled_secs);
        // No heartbeat (an idle node): no stall.
        let empty = tempfile::tempdir().unwrap();
        let mut node = NodeTelemetry::default();
        read_dir(empty.path(), Duration::from_secs(120), now).apply(&mut [], &mut node);
        assert_eq!((node.job_stalled_secs, node.jobs_running), (None, None));
    }

    /// Issue 46 point 10: a job on this node that writes another node's
    /// name (or an instance) into its series cannot make them that node's:
    /// the exporter sets Hostname itself and drops the job's host labels.
    #[test]
    fn exported_job_series_carry_this_nodes_name_whatever_the_job_wrote() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("train.prom"),
            "# a comment\n\
             nightshift_comm_overhead_pct{Hostname=\"gpu-b7\",instance=\"gpu-b7:9400\",job=\"llm\"} 34\n\
             nightshift_job_heartbeat_timestamp_seconds{node=\"x\",exported_instance=\"y\"} 1790000123.4 1790000123000\n\
             nightshift_gpu_mem_fragmentation_pct{gpu=\"1\",note=\"a \\\"q\\\" b\"} 28.5\n\
             nightshift_broken{gpu=1} 3\n\
             other_metric 1\n",
        )
        .unwrap();
        let out = exported_series(dir.path(), Duration::from_secs(120), SystemTime::now(), "gpu-a1");
        assert!(out.contains("nightshift_comm_overhead_pct{Hostname=\"gpu-a1\",job=\"llm\"} 34\n"), "{out}");
        assert!(
            out.contains("nightshift_job_heartbeat_timestamp_seconds{Hostname=\"gpu-a1\"} 1790000123.4\n"),
            "{out}"
        );
        assert!(
            out.contains(r#"nightshift_gpu_mem_fragmentation_pct{Hostname="gpu-a1",gpu="1",note="a \"q\" b"} 28.5"#),
            "{out}"
        );
        assert!(
            !out.contains("gpu-b7")
                && !out.contains("instance")
                && !out.contains("broken")
                && !out.contains("other_metric"),
            "{out}"
        );
        // A stale file is not served.
        let old = SystemTime::now() + Duration::from_secs(600);
        assert_eq!(exported_series(dir.path(), Duration::from_secs(120), old, "gpu-a1"), "");
    }
}
