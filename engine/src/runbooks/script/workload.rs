//! What the workload on a node is doing now, from its signals read together:
//! `workload()` in scripts. One place decides the cause the workload rows
//! name — H9 (starved), H10 (swings), H12 (communication) ask it — so no row
//! blames the data loader for a fragmented allocator, NCCL for a job's own
//! phases, or anything for a node with no GPU job (issue 57). The handbook's
//! per-model fragmentation limits live here too (`fragmentation_limit`),
//! for H6 and H9 alike.

use rhai::{Dynamic, Engine, EvalAltResult, Map};

use super::api::ctx;
use super::{Agg, Reading};
use crate::base::metrics;

/// The all-reduce share of step time past which a job is communication
/// bound (H12's budget, the field report's 15 %).
pub const COMM_BUDGET_PCT: f64 = 15.0;

/// GPU memory in use above which a process holds the GPU, where no job
/// heartbeat says whether a GPU job runs (a CUDA or HIP context alone takes
/// a few hundred MiB; an idle GPU reads under 1 %).
pub const GPU_HELD_MEM_PCT: f64 = 5.0;

/// The handbook's fragmentation limit for a GPU model (H6: V100 30 %,
/// A100 25 %, Instinct 15 %; other models 25 %): `(model, limit_pct)`.
pub fn fragmentation_limit(gpu_name: &str) -> (&'static str, f64) {
    if gpu_name.contains("V100") {
        ("V100", 30.0)
    } else if gpu_name.contains("A100") {
        ("A100", 25.0)
    } else if gpu_name.contains("Instinct") || gpu_name.contains("MI300") || gpu_name.contains("MI2") {
        ("Instinct", 15.0)
    } else {
        ("other", 25.0)
    }
}

/// A node's workload signals, each `None` where it is not read (no job
/// heartbeat, no NCCL timing file, an MI300X's missing counters).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    /// Jobs with a live heartbeat.
    pub jobs_running: Option<f64>,
    /// The most GPU memory in use on any GPU.
    pub max_mem_used_pct: Option<f64>,
    /// Per GPU: (index, model name, fragmentation %).
    pub fragmentation: Vec<(u32, String, f64)>,
    pub comm_share_pct: Option<f64>,
    pub links_down: Option<f64>,
    pub p2p_latency_us: Option<f64>,
    pub amd: bool,
}

/// What the signals say, together.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// `no_gpu_job`, `interconnect`, `fragmentation`, `comm_bound` or `none`.
    pub cause: &'static str,
    /// Whether a GPU job runs (`None`: nothing says; rows then assume one).
    pub gpu_job: Option<bool>,
    /// Where `gpu_job` came from.
    pub gpu_job_from: &'static str,
    /// The GPU furthest over its model's limit: (index, fragmentation %,
    /// model, limit %).
    pub fragmented: Option<(u32, f64, &'static str, f64)>,
    pub fabric: &'static str,
    /// Links up and P2P latency within the fabric's healthy range (`None`:
    /// neither is read).
    pub fabric_healthy: Option<bool>,
}

/// Healthy GPU-to-GPU latency bound: NVLink ~5 µs, Infinity Fabric ~12.
fn slow_us(amd: bool) -> f64 {
    if amd { 20.0 } else { 10.0 }
}

/// Decide. Order: no GPU job (nothing to diagnose), a degraded
/// interconnect (it explains swings, starvation and a high share alike),
/// fragmentation over the GPU model's own limit, a share over the budget.
pub fn decide(s: &Signals) -> Finding {
    let (gpu_job, gpu_job_from) = match (s.jobs_running, s.max_mem_used_pct) {
        (Some(n), _) => (Some(n > 0.0), "job heartbeat"),
        (None, Some(m)) => (Some(m > GPU_HELD_MEM_PCT), "GPU memory in use (no job heartbeat)"),
        (None, None) => (None, "nothing (no heartbeat, no memory reading)"),
    };
    let fabric = if s.amd { "Infinity Fabric" } else { "NVLink" };
    let degraded = s.links_down.is_some_and(|d| d > 0.0) || s.p2p_latency_us.is_some_and(|l| l > slow_us(s.amd));
    let fabric_healthy = (s.links_down.is_some() || s.p2p_latency_us.is_some()).then_some(!degraded);
    let fragmented = s
        .fragmentation
        .iter()
        .filter_map(|(i, name, pct)| {
            let (model, limit) = fragmentation_limit(name);
            (*pct > limit).then_some((*i, *pct, model, limit))
        })
        .max_by(|a, b| (a.1 - a.3).total_cmp(&(b.1 - b.3)));
    let cause = if gpu_job == Some(false) {
        "no_gpu_job"
    } else if degraded {
        "interconnect"
    } else if fragmented.is_some() {
        "fragmentation"
    } else if s.comm_share_pct.is_some_and(|c| c >= COMM_BUDGET_PCT) {
        "comm_bound"
    } else {
        "none"
    };
    Finding { cause, gpu_job, gpu_job_from, fragmented, fabric, fabric_healthy }
}

fn opt(v: Option<f64>) -> Dynamic {
    v.map_or(Dynamic::UNIT, Dynamic::from_float)
}

/// Register `workload()` and `fragmentation_limit(name)`.
pub(super) fn register(e: &mut Engine) {
    e.register_fn("fragmentation_limit", |name: &str| -> Map {
        let (model, limit) = fragmentation_limit(name);
        let mut m = Map::new();
        m.insert("model".into(), model.into());
        m.insert("pct".into(), Dynamic::from_float(limit));
        m
    });
    // How often this row acted on this target lately: a recurrence is a
    // finding of its own (H6: "the flush did not stick").
    e.register_fn("runs_within", |w: Dynamic| -> Result<i64, Box<EvalAltResult>> {
        let c = ctx()?;
        let secs = w.as_float().ok().or_else(|| w.as_int().ok().map(|i| i as f64));
        let secs = secs
            .filter(|s| s.is_finite() && (0.0..=86_400.0).contains(s))
            .ok_or_else(|| super::rt(format!("runs_within: expected 0 to 86400 seconds, found {w}")))?;
        Ok(c.host.runs_within(&c, (secs * 1000.0) as i64))
    });
    // The condition this runbook told about is gone (H7: the memory freed):
    // the next time it appears it is a new finding, told again.
    e.register_fn("finding_cleared", |why: &str| -> Result<(), Box<EvalAltResult>> {
        let c = ctx()?;
        c.host.finding_cleared(&c, why);
        Ok(())
    });
    e.register_fn("workload", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let node = c.node()?;
        c.observe_window(&node, 0)?;
        let read = |name: &str, gpu: Option<u32>| -> Option<f64> {
            let metric = metrics::metric_id(name)?;
            c.host.reading(&c, &Reading { node: node.clone(), gpu, metric, window_ms: 0, agg: Agg::Latest })
        };
        let info = c.host.node_info(&c, &node);
        let gpus = info.get("gpus").and_then(|g| g.as_int().ok()).unwrap_or(0).clamp(0, 4096) as u32;
        let amd = info.get("vendor").and_then(|v| v.clone().into_string().ok()).is_some_and(|v| v == "amd");
        let mut s = Signals {
            jobs_running: read("node.jobs_running", None),
            comm_share_pct: read("node.comm_overhead_pct", None),
            links_down: read("node.nvlink_links_down", None),
            p2p_latency_us: read("node.nvlink_p2p_latency_us", None),
            amd,
            ..Signals::default()
        };
        for i in 0..gpus {
            if let Some(m) = read("gpu.mem_used_pct", Some(i)) {
                s.max_mem_used_pct = Some(s.max_mem_used_pct.map_or(m, |x: f64| x.max(m)));
            }
            if let Some(f) = read("gpu.mem_fragmentation_pct", Some(i)) {
                let name = c.host.gpu_info(&c, &node, i).get("name").and_then(|n| n.clone().into_string().ok());
                s.fragmentation.push((i, name.unwrap_or_default(), f));
            }
        }
        let f = decide(&s);
        let mut m = Map::new();
        m.insert("cause".into(), f.cause.into());
        m.insert("gpu_job".into(), f.gpu_job.map_or(Dynamic::UNIT, Dynamic::from_bool));
        m.insert("gpu_job_from".into(), f.gpu_job_from.into());
        m.insert("fabric".into(), f.fabric.into());
        m.insert("fabric_healthy".into(), f.fabric_healthy.map_or(Dynamic::UNIT, Dynamic::from_bool));
        m.insert("comm_share_pct".into(), opt(s.comm_share_pct));
        m.insert("comm_budget_pct".into(), Dynamic::from_float(COMM_BUDGET_PCT));
        m.insert("links_down".into(), opt(s.links_down));
        m.insert("p2p_latency_us".into(), opt(s.p2p_latency_us));
        let (gpu, pct, model, limit) = match f.fragmented {
            Some((g, p, model, l)) => {
                (Dynamic::from_int(g.into()), Dynamic::from_float(p), model, Dynamic::from_float(l))
            }
            None => (Dynamic::UNIT, Dynamic::UNIT, "", Dynamic::UNIT),
        };
        m.insert("fragmented_gpu".into(), gpu);
        m.insert("fragmentation_pct".into(), pct);
        m.insert("fragmentation_model".into(), model.into());
        m.insert("fragmentation_limit_pct".into(), limit);
        Ok(m)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_read_from_the_signals_together() {
        let busy = |f: fn(&mut Signals)| {
            let mut s = Signals {
                jobs_running: Some(1.0),
                max_mem_used_pct: Some(90.0),
                fragmentation: vec![(0, "NVIDIA H100 80GB HBM3".into(), 5.0)],
                comm_share_pct: Some(9.0),
                links_down: Some(0.0),
                p2p_latency_us: Some(5.0),
                amd: false,
            };
            f(&mut s);
            decide(&s)
        };
        type Case = (&'static str, fn(&mut Signals), &'static str);
        let cases: Vec<Case> = vec![
            ("a healthy busy job", |_| {}, "none"),
            ("a CPU-only job: no heartbeat of a GPU job", |s| s.jobs_running = Some(0.0), "no_gpu_job"),
            (
                "no heartbeat, GPUs hold no memory",
                |s| {
                    s.jobs_running = None;
                    s.max_mem_used_pct = Some(0.5);
                },
                "no_gpu_job",
            ),
            (
                "no heartbeat, memory held: a GPU job",
                |s| {
                    s.jobs_running = None;
                    s.comm_share_pct = Some(30.0);
                },
                "comm_bound",
            ),
            (
                "an MI300X at 20 % is over Instinct's 15 %",
                |s| {
                    s.amd = true;
                    s.p2p_latency_us = Some(12.0);
                    s.fragmentation = vec![(3, "AMD Instinct MI300X".into(), 20.0)];
                },
                "fragmentation",
            ),
            ("an H100 at 20 % is within 25 %", |s| s.fragmentation = vec![(3, "NVIDIA H100".into(), 20.0)], "none"),
            ("12 µs is slow NVLink", |s| s.p2p_latency_us = Some(12.0), "interconnect"),
            (
                "12 µs is healthy Infinity Fabric",
                |s| {
                    s.amd = true;
                    s.p2p_latency_us = Some(12.0);
                },
                "none",
            ),
            (
                "a link down explains a high share",
                |s| {
                    s.links_down = Some(4.0);
                    s.comm_share_pct = Some(34.0);
                },
                "interconnect",
            ),
            ("a 30 % share on healthy links", |s| s.comm_share_pct = Some(30.0), "comm_bound"),
            ("no NCCL timing file: no share", |s| s.comm_share_pct = None, "none"),
        ];
        for (name, f, want) in cases {
            assert_eq!(busy(f).cause, want, "{name}");
        }
        let f = busy(|s| s.fragmentation = vec![(1, "A100".into(), 27.0), (5, "V100".into(), 33.0)]);
        assert_eq!(f.fragmented, Some((5, 33.0, "V100", 30.0)), "the GPU furthest over its own limit");
        assert_eq!(busy(|s| s.links_down = None).fabric_healthy, Some(true));
        assert_eq!(
            busy(|s| {
                s.links_down = None;
                s.p2p_latency_us = None;
            })
            .fabric_healthy,
            None
        );
    }
}
