//! The fleet-month's report: one JSON document (no wall-clock field in it:
//! the same seed gives the same bytes) and an HTML page drawn from it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::account::{Accounting, Stats, round3};
use super::mix::FaultMix;
use super::schedule::Fault;
use super::{Counts, MANUAL_ALERT_LAG_MS, MANUAL_MTTR_MS, PolicyRun, SimulateOptions};

#[derive(Debug, Clone, Serialize)]
pub struct FleetInfo {
    pub nodes: usize,
    pub gpus: u64,
    pub gpus_per_node: u32,
    pub profile: String,
    pub days: f64,
    pub job_nodes: usize,
    pub standby_nodes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub checkpoint_secs: u64,
    pub restart_secs: u64,
    pub manual_alert_lag_secs: i64,
    pub manual_mttr_secs: i64,
    pub quiet_feed_secs: u64,
    pub engine_restart_every_secs: u64,
    pub pager_outage_every_secs: u64,
    pub pager_outage_secs: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    #[serde(flatten)]
    pub accounting: Accounting,
    pub time_to_quarantine_by_class_secs: BTreeMap<String, Stats>,
    #[serde(flatten)]
    pub counts: Counts,
    pub pages: u64,
    pub pages_by_class: BTreeMap<String, u64>,
    pub pages_per_week: Vec<u64>,
    /// Notifications to the team's chat (not pages).
    pub chat_messages: u64,
    pub chat_messages_by_class: BTreeMap<String, u64>,
    /// Pages and chat messages by the runbook that said them.
    pub told_by_runbook: BTreeMap<String, u64>,
    /// Share of the fleet in service, hour by hour, in percent.
    pub in_service_pct_by_hour: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub version: u32,
    pub mix: String,
    pub source: String,
    pub fleet: FleetInfo,
    pub seed: u64,
    pub faults: usize,
    pub faults_by_class: BTreeMap<String, u64>,
    pub model: ModelInfo,
    pub policies: BTreeMap<String, PolicyReport>,
}

pub fn build(
    opts: &SimulateOptions,
    mix: &FaultMix,
    faults: &[Fault],
    runs: &BTreeMap<&'static str, PolicyRun>,
) -> Report {
    let horizon = opts.horizon_ms();
    let mut faults_by_class: BTreeMap<String, u64> = mix.classes.iter().map(|c| (c.name.clone(), 0)).collect();
    for f in faults {
        *faults_by_class.entry(mix.classes[f.class].name.clone()).or_default() += 1;
    }
    let weeks = ((horizon + 7 * 86_400_000 - 1) / (7 * 86_400_000)).max(1) as usize;
    let hours = ((horizon + 3_599_999) / 3_600_000).max(1) as usize;
    let policies = runs
        .iter()
        .map(|(name, p)| {
            let mut by_class: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for (i, f) in faults.iter().enumerate() {
                let c = &mix.classes[f.class];
                if !c.signal.hardware() {
                    continue;
                }
                let q = p.outcomes[i].quarantined_ms.unwrap_or(horizon).min(horizon);
                by_class.entry(c.name.clone()).or_default().push(((q - f.at_ms).max(0) / 1000) as u64);
            }
            let mut pages_by_class = BTreeMap::new();
            let mut per_week = vec![0u64; weeks];
            for (t, class) in &p.pages {
                *pages_by_class.entry(class.clone()).or_default() += 1;
                let w = ((*t).max(0) / (7 * 86_400_000)) as usize;
                per_week[w.min(weeks - 1)] += 1;
            }
            let report = PolicyReport {
                accounting: p.accounting.clone(),
                counts: p.counts.clone(),
                time_to_quarantine_by_class_secs: by_class.into_iter().map(|(k, v)| (k, Stats::of(v))).collect(),
                pages: p.pages.len() as u64,
                pages_by_class,
                pages_per_week: per_week,
                chat_messages: p.chat_messages.len() as u64,
                chat_messages_by_class: p.chat_messages.iter().fold(BTreeMap::new(), |mut m, (_, c)| {
                    *m.entry(c.clone()).or_default() += 1;
                    m
                }),
                told_by_runbook: p.told_by_runbook.clone(),
                in_service_pct_by_hour: in_service(&p.out_of_service, opts.nodes, hours),
            };
            (name.to_string(), report)
        })
        .collect();
    Report {
        version: 1,
        mix: mix.name.clone(),
        source: mix.source.clone(),
        fleet: FleetInfo {
            nodes: opts.nodes,
            gpus: opts.nodes as u64 * opts.gpus_per_node as u64,
            gpus_per_node: opts.gpus_per_node,
            profile: opts.profile.clone(),
            days: opts.days,
            job_nodes: opts.job_nodes(),
            standby_nodes: opts.nodes - opts.job_nodes(),
        },
        seed: opts.seed,
        faults: faults.len(),
        faults_by_class,
        model: ModelInfo {
            checkpoint_secs: opts.checkpoint_secs,
            restart_secs: opts.restart_secs,
            manual_alert_lag_secs: MANUAL_ALERT_LAG_MS / 1000,
            manual_mttr_secs: MANUAL_MTTR_MS / 1000,
            quiet_feed_secs: opts.quiet_feed_secs,
            engine_restart_every_secs: opts.engine_restart_every_secs,
            pager_outage_every_secs: opts.pager_outage_every_secs,
            pager_outage_secs: opts.pager_outage_secs,
        },
        policies,
    }
}

/// Share of nodes in service per hour (time-weighted), in percent.
fn in_service(spans: &[Vec<(i64, i64)>], nodes: usize, hours: usize) -> Vec<f64> {
    let mut out_ms = vec![0i64; hours];
    for node in spans {
        for &(a, b) in node {
            let mut t = a.max(0);
            while t < b {
                let h = (t / 3_600_000) as usize;
                if h >= hours {
                    break;
                }
                let end = b.min((h as i64 + 1) * 3_600_000);
                out_ms[h] += end - t;
                t = end;
            }
        }
    }
    out_ms.iter().map(|&o| round3(100.0 * (1.0 - o as f64 / (nodes.max(1) as f64 * 3_600_000.0)))).collect()
}

impl Report {
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        s.push('\n');
        s
    }

    /// A one-screen summary for the terminal.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} nodes × {} GPUs, {} days, seed {}: {} faults ({})\n",
            self.fleet.nodes, self.fleet.gpus_per_node, self.fleet.days, self.seed, self.faults, self.mix
        );
        s.push_str(&format!(
            "{:<11} {:>8} {:>12} {:>10} {:>10} {:>8} {:>8} {:>6} {:>8}\n",
            "policy", "ETTR", "GPU-h lost", "TTQ p50", "TTQ p99", "restarts", "healthy", "pages", "onto-bad"
        ));
        for (name, p) in &self.policies {
            let a = &p.accounting;
            s.push_str(&format!(
                "{:<11} {:>8.4} {:>12.1} {:>9}s {:>9}s {:>8} {:>8} {:>6} {:>8}\n",
                name,
                a.ettr,
                a.gpu_hours_lost,
                a.time_to_quarantine_secs.p50,
                a.time_to_quarantine_secs.p99,
                a.job_interruptions,
                p.counts.healthy_gpu_actions,
                p.pages,
                a.restarts_onto_broken_nodes
            ));
        }
        if let Some(p) = self.policies.get("nightshift") {
            s.push_str(&format!(
                "nightshift: {} engine restart(s) with {} mitigation(s) in force, {} weakened by one; {} pager outage(s), {} page(s) lost\n",
                p.counts.engine_restarts,
                p.counts.mitigations_in_force_at_restart,
                p.counts.mitigations_weakened_by_restart,
                p.counts.pager_outages,
                p.counts.pages_lost
            ));
        }
        s
    }

    /// The HTML page: capacity over time, ETTR, time to quarantine by class
    /// and pages per week, per policy, as inline SVG (no script, no
    /// network).
    pub fn to_html(&self) -> String {
        let colors = [("manual", "#c0392b"), ("nightshift", "#2471a3"), ("oracle", "#7f8c8d")];
        let color = |n: &str| colors.iter().find(|c| c.0 == n).map(|c| c.1).unwrap_or("#000");
        let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
        let mut h = String::new();
        h.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>nightshift simulate: ");
        h.push_str(&esc(&self.mix));
        h.push_str("</title><style>body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}th:first-child,td:first-child{text-align:left}svg{background:#fafafa;border:1px solid #ddd}.k{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}</style></head><body>");
        h.push_str(&format!(
            "<h1>A fleet-month: {}</h1><p>{} nodes × {} GPUs ({}), {} days, seed {}, {} faults drawn from <em>{}</em>. One synchronous job on {} nodes, {} standbys; checkpoint every {} s, restart {} s. Manual: seen after {} s, out of service after {} s more.</p>",
            esc(&self.mix),
            self.fleet.nodes,
            self.fleet.gpus_per_node,
            esc(&self.fleet.profile),
            self.fleet.days,
            self.seed,
            self.faults,
            esc(&self.source),
            self.fleet.job_nodes,
            self.fleet.standby_nodes,
            self.model.checkpoint_secs,
            self.model.restart_secs,
            self.model.manual_alert_lag_secs,
            self.model.manual_mttr_secs
        ));
        h.push_str("<p>");
        for n in self.policies.keys() {
            h.push_str(&format!("<span class=\"k\" style=\"background:{}\"></span>{}", color(n), esc(n)));
        }
        h.push_str("</p><h2>Summary</h2><table><tr><th>policy</th><th>ETTR</th><th>GPU-hours lost</th><th>TTQ p50 s</th><th>TTQ p99 s</th><th>job interruptions</th><th>restarts onto broken nodes</th><th>actions on healthy GPUs</th><th>wrong RMAs</th><th>pages</th><th>chat messages</th><th>left to people</th><th>undetected</th></tr>");
        for (n, p) in &self.policies {
            let a = &p.accounting;
            h.push_str(&format!(
                "<tr><td>{}</td><td>{:.4}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(n),
                a.ettr,
                a.gpu_hours_lost,
                a.time_to_quarantine_secs.p50,
                a.time_to_quarantine_secs.p99,
                a.job_interruptions,
                a.restarts_onto_broken_nodes,
                p.counts.healthy_gpu_actions,
                p.counts.wrong_rma,
                p.pages,
                p.chat_messages,
                p.counts.left_to_people,
                a.undetected
            ));
        }
        h.push_str("</table>");
        if let Some(p) = self.policies.get("nightshift") {
            h.push_str(&format!(
                "<p>Operations under nightshift: {} engine restart(s) with {} mitigation(s) in force, {} weakened by one; {} pager outage(s), {} page(s) lost.</p>",
                p.counts.engine_restarts,
                p.counts.mitigations_in_force_at_restart,
                p.counts.mitigations_weakened_by_restart,
                p.counts.pager_outages,
                p.counts.pages_lost
            ));
        }
        // Serving capacity over time.
        let (w, ht) = (1000.0, 220.0);
        h.push_str("<h2>Fleet in service, hour by hour (%)</h2>");
        let lo = self
            .policies
            .values()
            .flat_map(|p| p.in_service_pct_by_hour.iter().copied())
            .fold(100.0f64, f64::min)
            .min(99.0)
            .floor();
        h.push_str(&format!("<svg width=\"{w}\" height=\"{ht}\" viewBox=\"0 0 {w} {ht}\">"));
        for (n, p) in &self.policies {
            let v = &p.in_service_pct_by_hour;
            let pts: Vec<String> = v
                .iter()
                .enumerate()
                .map(|(i, y)| {
                    let x = i as f64 / (v.len().max(2) - 1) as f64 * (w - 40.0) + 30.0;
                    let yy = ht - 20.0 - (y - lo) / (100.0 - lo).max(0.001) * (ht - 40.0);
                    format!("{x:.1},{yy:.1}")
                })
                .collect();
            h.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
                color(n),
                pts.join(" ")
            ));
        }
        h.push_str(&format!("<text x=\"2\" y=\"16\">100</text><text x=\"2\" y=\"{}\">{lo}</text></svg>", ht - 22.0));
        // ETTR and GPU-hours lost.
        // ETTR as bars; the causes as rows, one column a policy.
        h.push_str("<h2>ETTR</h2><table><tr><th>policy</th><th>ETTR</th></tr>");
        for (n, p) in &self.policies {
            h.push_str(&format!(
                "<tr><td>{}</td><td><svg width=\"200\" height=\"14\"><rect width=\"{:.1}\" height=\"14\" fill=\"{}\"/></svg> {:.4}</td></tr>",
                esc(n),
                p.accounting.ettr * 200.0,
                color(n),
                p.accounting.ettr
            ));
        }
        h.push_str("</table><h2>GPU-hours lost by cause</h2><table><tr><th>cause</th>");
        for n in self.policies.keys() {
            h.push_str(&format!("<th>{}</th>", esc(n)));
        }
        h.push_str("</tr>");
        let causes: Vec<String> = self
            .policies
            .values()
            .next()
            .map(|p| p.accounting.gpu_hours_lost_by_cause.keys().cloned().collect())
            .unwrap_or_default();
        for c in &causes {
            h.push_str(&format!("<tr><td>{}</td>", esc(&c.replace('_', " "))));
            for p in self.policies.values() {
                h.push_str(&format!("<td>{:.1}</td>", p.accounting.gpu_hours_lost_by_cause.get(c).unwrap_or(&0.0)));
            }
            h.push_str("</tr>");
        }
        h.push_str("<tr><th>total</th>");
        for p in self.policies.values() {
            h.push_str(&format!("<th>{:.1}</th>", p.accounting.gpu_hours_lost));
        }
        h.push_str("</tr></table>");
        // Time to quarantine by class.
        h.push_str(
            "<h2>Time to quarantine by fault class (s: p50 / p99 / max)</h2><table><tr><th>class</th><th>faults</th>",
        );
        for n in self.policies.keys() {
            h.push_str(&format!("<th>{}</th>", esc(n)));
        }
        h.push_str("</tr>");
        for (class, count) in &self.faults_by_class {
            let rows: Vec<String> = self
                .policies
                .values()
                .map(|p| match p.time_to_quarantine_by_class_secs.get(class) {
                    Some(s) => format!("{} / {} / {}", s.p50, s.p99, s.max),
                    None => "—".into(),
                })
                .collect();
            if rows.iter().all(|r| r == "—") {
                continue;
            }
            h.push_str(&format!("<tr><td>{}</td><td>{count}</td>", esc(class)));
            for r in rows {
                h.push_str(&format!("<td>{r}</td>"));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
        // Pages per week.
        h.push_str("<h2>Pages per week</h2>");
        let max = self.policies.values().flat_map(|p| p.pages_per_week.iter().copied()).max().unwrap_or(1).max(1);
        let weeks = self.policies.values().map(|p| p.pages_per_week.len()).max().unwrap_or(1);
        let bw = (w - 40.0) / (weeks as f64 * (self.policies.len() as f64 + 1.0));
        h.push_str(&format!("<svg width=\"{w}\" height=\"{ht}\" viewBox=\"0 0 {w} {ht}\">"));
        for (pi, (n, p)) in self.policies.iter().enumerate() {
            for (wk, c) in p.pages_per_week.iter().enumerate() {
                let x = 30.0 + (wk as f64 * (self.policies.len() as f64 + 1.0) + pi as f64) * bw;
                let bh = *c as f64 / max as f64 * (ht - 40.0);
                h.push_str(&format!(
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"><title>{} week {}: {c}</title></rect>",
                    ht - 20.0 - bh,
                    bw * 0.9,
                    color(n),
                    esc(n),
                    wk + 1
                ));
            }
        }
        h.push_str(&format!("<text x=\"2\" y=\"16\">{max}</text></svg>"));
        h.push_str("<h2>Pages by class</h2><table><tr><th>class</th>");
        for n in self.policies.keys() {
            h.push_str(&format!("<th>{}</th>", esc(n)));
        }
        h.push_str("</tr>");
        let mut classes: std::collections::BTreeSet<&String> = Default::default();
        for p in self.policies.values() {
            classes.extend(p.pages_by_class.keys());
        }
        for c in classes {
            h.push_str(&format!("<tr><td>{}</td>", esc(c)));
            for p in self.policies.values() {
                h.push_str(&format!("<td>{}</td>", p.pages_by_class.get(c).unwrap_or(&0)));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table><p>Generated by <code>nightshift simulate</code>; the model and what it leaves out: docs/OUTCOME.md.</p></body></html>\n");
        h
    }
}

/// One figure over K seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread { mean: 0.0, min: 0.0, max: 0.0 };
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean: round3(mean), min: round3(min), max: round3(max) }
    }
}

/// The headline figures of each policy over several seeds (`--seeds K`).
#[derive(Debug, Clone, Serialize)]
pub struct SeedsReport {
    pub version: u32,
    pub mix: String,
    pub fleet: FleetInfo,
    pub seeds: Vec<u64>,
    pub faults: Spread,
    pub policies: BTreeMap<String, BTreeMap<&'static str, Spread>>,
    pub runs: Vec<Report>,
}

/// The figures `--seeds` reports the spread of.
const SPREAD_FIGURES: [&str; 9] = [
    "ettr",
    "gpu_hours_lost",
    "time_to_quarantine_p99_secs",
    "job_interruptions",
    "restarts_onto_broken_nodes",
    "healthy_gpu_actions",
    "wrong_rma",
    "pages",
    "undetected",
];

fn figure(p: &PolicyReport, name: &str) -> f64 {
    let a = &p.accounting;
    match name {
        "ettr" => a.ettr,
        "gpu_hours_lost" => a.gpu_hours_lost,
        "time_to_quarantine_p99_secs" => a.time_to_quarantine_secs.p99 as f64,
        "job_interruptions" => a.job_interruptions as f64,
        "restarts_onto_broken_nodes" => a.restarts_onto_broken_nodes as f64,
        "healthy_gpu_actions" => p.counts.healthy_gpu_actions as f64,
        "wrong_rma" => p.counts.wrong_rma as f64,
        "pages" => p.pages as f64,
        _ => a.undetected as f64,
    }
}

impl SeedsReport {
    /// `None` for no runs.
    pub fn of(runs: Vec<Report>) -> Option<SeedsReport> {
        let first = runs.first()?;
        let mut policies: BTreeMap<String, BTreeMap<&'static str, Spread>> = BTreeMap::new();
        for name in first.policies.keys() {
            let mut figs = BTreeMap::new();
            for f in SPREAD_FIGURES {
                let v: Vec<f64> = runs.iter().filter_map(|r| r.policies.get(name)).map(|p| figure(p, f)).collect();
                figs.insert(f, Spread::of(&v));
            }
            policies.insert(name.clone(), figs);
        }
        let faults: Vec<f64> = runs.iter().map(|r| r.faults as f64).collect();
        Some(SeedsReport {
            version: 1,
            mix: first.mix.clone(),
            fleet: first.fleet.clone(),
            seeds: runs.iter().map(|r| r.seed).collect(),
            faults: Spread::of(&faults),
            policies,
            runs,
        })
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        s.push('\n');
        s
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} seeds ({:?}): faults mean {} (min {}, max {})\n{:<11} {:>26} {:>28} {:>22}\n",
            self.seeds.len(),
            self.seeds,
            self.faults.mean,
            self.faults.min,
            self.faults.max,
            "policy",
            "ETTR mean [min, max]",
            "GPU-h lost mean [min, max]",
            "pages mean [min, max]"
        );
        for (n, f) in &self.policies {
            let show = |k: &str, prec: usize| {
                let x = &f[k];
                format!("{:.prec$} [{:.prec$}, {:.prec$}]", x.mean, x.min, x.max)
            };
            s.push_str(&format!(
                "{:<11} {:>26} {:>28} {:>22}\n",
                n,
                show("ettr", 4),
                show("gpu_hours_lost", 1),
                show("pages", 1)
            ));
        }
        s
    }
}

#[cfg(test)]
#[test]
fn spread_is_mean_min_max_and_empty_is_zero() {
    assert_eq!(Spread::of(&[1.0, 2.0, 6.0]), Spread { mean: 3.0, min: 1.0, max: 6.0 });
    assert_eq!(Spread::of(&[]), Spread { mean: 0.0, min: 0.0, max: 0.0 });
}
