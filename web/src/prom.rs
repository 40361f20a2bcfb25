//! `/metrics` in the Prometheus text exposition format (version 0.0.4).

use std::fmt::Write;

use nightshift_engine::engine::Engine;
use nightshift_proto::exposition::{escape, fmt_value as fmt_f};

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Render every nightshift metric.
pub fn render(engine: &Engine) -> String {
    let c = engine.counters();
    let mut out = String::with_capacity(4096);
    let counters = [
        ("nightshift_samples_ingested_total", "Telemetry samples ingested.", c.samples_ingested),
        ("nightshift_alerts_received_total", "Alertmanager alerts received, duplicates included.", c.alerts_received),
        (
            "nightshift_alerts_duplicate_total",
            "Alerts dropped as repeats of a fingerprint and startsAt.",
            c.alerts_duplicate,
        ),
        ("nightshift_alerts_unknown_node_total", "Alerts naming a host not in the inventory.", c.alerts_unknown_node),
        ("nightshift_events_dropped_total", "Events dropped: stale, unknown node, or shed.", c.events_dropped),
        (
            "nightshift_source_samples_total",
            "Samples pulled from Prometheus or exporters and mapped to the fleet.",
            c.source_samples,
        ),
        (
            "nightshift_source_ignored_total",
            "Pulled samples ignored: other series, unknown hosts or GPUs, NaN.",
            c.source_ignored,
        ),
        ("nightshift_source_errors_total", "Pulls from Prometheus or exporters that failed.", c.source_errors),
        ("nightshift_events_shed_total", "Events shed because the run queue was full.", c.events_shed),
        ("nightshift_triggers_fired_total", "Trigger fires.", c.triggers_fired),
        (
            "nightshift_pages_undeliverable_total",
            "Pages given up after notifications.page_expiry_secs without a delivery (since this engine started).",
            engine.gauges().pages_undeliverable,
        ),
        (
            "nightshift_runs_suppressed_total",
            "Run requests suppressed by dedup, cooldown or a tripped breaker.",
            c.runs_suppressed,
        ),
    ];
    for (name, help, v) in counters {
        family(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    family(
        &mut out,
        "nightshift_told_total",
        "counter",
        "What runbooks told people, by runbook and kind: notification, escalation, or repeat_noted (a finding said again within notifications.remind_after_secs, kept as a note).",
    );
    for ((rb, kind), n) in &c.told {
        let _ = writeln!(out, "nightshift_told_total{{runbook=\"{}\",kind=\"{kind}\"}} {n}", escape(rb));
    }
    family(&mut out, "nightshift_runs_total", "counter", "Finished runs by outcome.");
    for o in nightshift_engine::api::RunOutcome::ALL.map(|o| o.as_str()) {
        let _ = writeln!(
            out,
            "nightshift_runs_total{{outcome=\"{o}\"}} {}",
            c.runs_by_outcome.get(o).copied().unwrap_or(0)
        );
    }
    family(
        &mut out,
        "nightshift_action_duration_seconds",
        "histogram",
        "Time from sending an action to the agent's reply.",
    );
    {
        let h = &c.action_latency;
        for (b, n) in h.bounds.iter().zip(&h.counts) {
            let _ = writeln!(out, "nightshift_action_duration_seconds_bucket{{le=\"{}\"}} {n}", fmt_f(*b));
        }
        let _ = writeln!(out, "nightshift_action_duration_seconds_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "nightshift_action_duration_seconds_sum {}", fmt_f(h.sum));
        let _ = writeln!(out, "nightshift_action_duration_seconds_count {}", h.count);
    }
    let gauges = [
        (
            "nightshift_queue_depth",
            "Runs waiting to start (queued or pending approval).",
            engine.gauges().queue_depth as f64,
        ),
        ("nightshift_runs_running", "Runs executing now.", engine.running() as f64),
        ("nightshift_agents", "Agents in the inventory.", engine.node_names().len() as f64),
        ("nightshift_agents_connected", "Agents connected now.", engine.gauges().agents_connected as f64),
        ("nightshift_audit_sequence", "Sequence number of the newest audit record.", engine.audit().head_seq() as f64),
        ("nightshift_runbooks_loaded", "Runbooks loaded.", engine.runbook_set().runbooks.len() as f64),
        ("nightshift_runbook_errors", "Runbook files that failed to load.", engine.runbook_set().errors.len() as f64),
        (
            "nightshift_pages_pending",
            "Pages (notifications, escalations) not delivered yet to a target: retried until delivered or expired.",
            engine.gauges().pages_pending as f64,
        ),
    ];
    for (name, help, v) in gauges {
        family(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name} {}", fmt_f(v));
    }
    family(
        &mut out,
        "nightshift_holds",
        "gauge",
        "Holds in effect on the fleet by setting kind and by whether a lease ends them (sticky: only a person does).",
    );
    let mut holds: std::collections::BTreeMap<(&str, bool), usize> = Default::default();
    for kind in ["power_limit", "fan_curve", "clocks", "gpu_drain", "node_drain", "config"] {
        holds.insert((kind, false), 0);
    }
    for (_, h) in engine.active_holds() {
        *holds.entry((h.setting.kind(), h.sticky())).or_default() += 1;
    }
    for ((kind, sticky), n) in holds {
        let _ = writeln!(out, "nightshift_holds{{kind=\"{kind}\",sticky=\"{sticky}\"}} {n}");
    }
    let ha = engine.ha_status();
    if let Some(shard) = &ha.shard {
        family(&mut out, "nightshift_ha_leader", "gauge", "1 while this engine holds its shard's lease.");
        let _ = writeln!(out, "nightshift_ha_leader{{shard=\"{}\"}} {}", shard, u8::from(ha.role == "leader"));
        family(&mut out, "nightshift_ha_term", "gauge", "The lease term this engine leads at (0 while standing by).");
        let _ = writeln!(out, "nightshift_ha_term{{shard=\"{}\"}} {}", shard, ha.term.unwrap_or(0));
        family(
            &mut out,
            "nightshift_ha_lease_age_seconds",
            "gauge",
            "Seconds since the leader last took or renewed its lease (NaN while standing by).",
        );
        let age = ha.lease_age_ms.map_or(f64::NAN, |ms| ms as f64 / 1000.0);
        let _ = writeln!(out, "nightshift_ha_lease_age_seconds{{shard=\"{}\"}} {}", shard, fmt_f(age));
    }
    health(&mut out, engine);
    let (series, points) = {
        let g = engine.gauges();
        (g.telemetry_series, g.telemetry_points)
    };
    family(&mut out, "nightshift_telemetry_series", "gauge", "Telemetry series held.");
    let _ = writeln!(out, "nightshift_telemetry_series {series}");
    family(&mut out, "nightshift_telemetry_points", "gauge", "Telemetry points held in trigger windows.");
    let _ = writeln!(out, "nightshift_telemetry_points {points}");
    out
}

/// Upper bounds of the repair histogram, in seconds: a minute to three days.
const REPAIR_BUCKETS_SECS: [f64; 11] =
    [60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 259200.0];

/// The health model: GPUs per state, and how long each phase of a fault's
/// lifecycle took (the seeds' complaints — a 45-minute alert lag, a
/// 42-minute MTTR — become a before and after).
fn health(out: &mut String, engine: &Engine) {
    use nightshift_engine::api::HealthState;
    let model = engine.health_model();
    let counts = model.counts();
    let tracked: usize = counts.values().sum();
    family(
        out,
        "nightshift_gpu_health",
        "gauge",
        "GPUs by health state (healthy includes every GPU no fault touched).",
    );
    for st in HealthState::ALL {
        let mut n = counts.get(&st).copied().unwrap_or(0);
        if st == HealthState::Healthy {
            n += engine.fleet_gpus().saturating_sub(tracked);
        }
        let _ = writeln!(out, "nightshift_gpu_health{{state=\"{}\"}} {n}", st.as_str());
    }
    family(
        out,
        "nightshift_repair_seconds",
        "histogram",
        "Seconds from a fault being seen to each phase of its lifecycle (quarantined, requeued, repaired, verified), by fault kind; the lifecycles the engine holds (rebuilt from the audit chain).",
    );
    let mut hist: std::collections::BTreeMap<(&str, &str), (Vec<u64>, u64, f64)> = Default::default();
    for (_, h) in model.all() {
        let current = h.fault.as_ref().zip(h.lifecycle.as_ref()).map(|(f, l)| (f.kind, *l));
        for (kind, l) in h.history.iter().copied().chain(current) {
            for (phase, secs) in l.phases().reached() {
                let e =
                    hist.entry((kind.as_str(), phase)).or_insert_with(|| (vec![0; REPAIR_BUCKETS_SECS.len()], 0, 0.0));
                for (i, b) in REPAIR_BUCKETS_SECS.iter().enumerate() {
                    if secs <= *b {
                        e.0[i] += 1;
                    }
                }
                e.1 += 1;
                e.2 += secs;
            }
        }
    }
    for ((kind, phase), (buckets, count, sum)) in hist {
        let l = format!("kind=\"{kind}\",phase=\"{phase}\"");
        for (b, n) in REPAIR_BUCKETS_SECS.iter().zip(&buckets) {
            let _ = writeln!(out, "nightshift_repair_seconds_bucket{{{l},le=\"{}\"}} {n}", fmt_f(*b));
        }
        let _ = writeln!(out, "nightshift_repair_seconds_bucket{{{l},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "nightshift_repair_seconds_sum{{{l}}} {}", fmt_f(sum));
        let _ = writeln!(out, "nightshift_repair_seconds_count{{{l}}} {count}");
    }
}
