//! `/metrics` in the Prometheus text exposition format (version 0.0.4).

use nightshift_engine::engine::Engine;
use nightshift_proto::exposition::{Family, Histogram, Labels, WriteError, labels, write};

/// Every nightshift metric, written by `prometheus-client`
/// (`nightshift_proto::exposition::write`).
pub fn render(engine: &Engine) -> Result<String, WriteError> {
    write(families(engine))
}

/// What one scrape shows, gathered from the engine as plain data.
fn families(engine: &Engine) -> Vec<Family> {
    let c = engine.counters();
    let gauges = engine.gauges();
    let mut out = Vec::with_capacity(40);
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
            gauges.pages_undeliverable,
        ),
        (
            "nightshift_runs_suppressed_total",
            "Run requests suppressed by dedup, cooldown or a tripped breaker.",
            c.runs_suppressed,
        ),
    ];
    for (name, help, v) in counters {
        out.push(Family::counter(name, help, v));
    }
    out.push(Family::counters(
        "nightshift_told_total",
        "What runbooks told people, by runbook and kind: notification, escalation, or repeat_noted (a finding said again within notifications.remind_after_secs, kept as a note).",
        c.told.iter().map(|((rb, kind), n)| (labels([("runbook", rb.as_str()), ("kind", kind.as_str())]), *n)).collect(),
    ));
    out.push(Family::counters(
        "nightshift_runs_total",
        "Finished runs by outcome.",
        nightshift_engine::api::RunOutcome::ALL
            .map(|o| o.as_str())
            .into_iter()
            .map(|o| (labels([("outcome", o)]), c.runs_by_outcome.get(o).copied().unwrap_or(0)))
            .collect(),
    ));
    let h = &c.action_latency;
    out.push(Family::histograms(
        "nightshift_action_duration_seconds",
        "Time from sending an action to the agent's reply.",
        vec![(
            Labels::new(),
            Histogram {
                cumulative: h.bounds.iter().copied().zip(h.counts.iter().copied()).collect(),
                count: h.count,
                sum: h.sum,
            },
        )],
    ));
    let levels = [
        ("nightshift_queue_depth", "Runs waiting to start (queued or pending approval).", gauges.queue_depth as f64),
        ("nightshift_runs_running", "Runs executing now.", engine.running() as f64),
        ("nightshift_agents", "Agents in the inventory.", engine.node_names().len() as f64),
        ("nightshift_agents_connected", "Agents connected now.", gauges.agents_connected as f64),
        ("nightshift_audit_sequence", "Sequence number of the newest audit record.", engine.audit().head_seq() as f64),
        ("nightshift_runbooks_loaded", "Runbooks loaded.", engine.runbook_set().runbooks.len() as f64),
        ("nightshift_runbook_errors", "Runbook files that failed to load.", engine.runbook_set().errors.len() as f64),
        (
            "nightshift_pages_pending",
            "Pages (notifications, escalations) not delivered yet to a target: retried until delivered or expired.",
            gauges.pages_pending as f64,
        ),
    ];
    for (name, help, v) in levels {
        out.push(Family::gauge(name, help, v));
    }
    let mut holds: std::collections::BTreeMap<(&str, bool), usize> = Default::default();
    for kind in ["power_limit", "fan_curve", "clocks", "gpu_drain", "node_drain", "config"] {
        holds.insert((kind, false), 0);
    }
    for (_, h) in engine.active_holds() {
        *holds.entry((h.setting.kind(), h.sticky())).or_default() += 1;
    }
    out.push(Family::gauges(
        "nightshift_holds",
        "Holds in effect on the fleet by setting kind and by whether a lease ends them (sticky: only a person does).",
        holds
            .into_iter()
            .map(|((kind, sticky), n)| {
                (labels([("kind", kind), ("sticky", if sticky { "true" } else { "false" })]), n as f64)
            })
            .collect(),
    ));
    let ha = engine.ha_status();
    if let Some(shard) = &ha.shard {
        let on = || labels([("shard", shard.as_str())]);
        out.push(Family::gauges(
            "nightshift_ha_leader",
            "1 while this engine holds its shard's lease.",
            vec![(on(), f64::from(u8::from(ha.role == "leader")))],
        ));
        out.push(Family::gauges(
            "nightshift_ha_term",
            "The lease term this engine leads at (0 while standing by).",
            vec![(on(), ha.term.unwrap_or(0) as f64)],
        ));
        out.push(Family::gauges(
            "nightshift_ha_lease_age_seconds",
            "Seconds since the leader last took or renewed its lease (NaN while standing by).",
            vec![(on(), ha.lease_age_ms.map_or(f64::NAN, |ms| ms as f64 / 1000.0))],
        ));
    }
    health(&mut out, engine);
    out.push(Family::gauge("nightshift_telemetry_series", "Telemetry series held.", gauges.telemetry_series as f64));
    out.push(Family::gauge(
        "nightshift_telemetry_points",
        "Telemetry points held in trigger windows.",
        gauges.telemetry_points as f64,
    ));
    out
}

/// Upper bounds of the repair histogram, in seconds: a minute to three days.
const REPAIR_BUCKETS_SECS: [f64; 11] =
    [60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 259200.0];

/// The health model: GPUs per state, and how long each phase of a fault's
/// lifecycle took (the seeds' complaints — a 45-minute alert lag, a
/// 42-minute MTTR — become a before and after).
fn health(out: &mut Vec<Family>, engine: &Engine) {
    use nightshift_engine::api::HealthState;
    let model = engine.health_model();
    let counts = model.counts();
    let tracked: usize = counts.values().sum();
    out.push(Family::gauges(
        "nightshift_gpu_health",
        "GPUs by health state (healthy includes every GPU no fault touched).",
        HealthState::ALL
            .into_iter()
            .map(|st| {
                let mut n = counts.get(&st).copied().unwrap_or(0);
                if st == HealthState::Healthy {
                    n += engine.fleet_gpus().saturating_sub(tracked);
                }
                (labels([("state", st.as_str())]), n as f64)
            })
            .collect(),
    ));
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
    out.push(Family::histograms(
        "nightshift_repair_seconds",
        "Seconds from a fault being seen to each phase of its lifecycle (quarantined, requeued, repaired, verified), by fault kind; the lifecycles the engine holds (rebuilt from the audit chain).",
        hist.into_iter()
            .map(|((kind, phase), (buckets, count, sum))| {
                (
                    labels([("kind", kind), ("phase", phase)]),
                    Histogram { cumulative: REPAIR_BUCKETS_SECS.iter().copied().zip(buckets).collect(), count, sum },
                )
            })
            .collect(),
    ));
}
