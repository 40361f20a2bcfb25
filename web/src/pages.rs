//! Server-rendered pages (maud: every interpolation is escaped). A little
//! plain JavaScript (`assets/app.js`) adds the live tail.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use nightshift_engine::api::format_rfc3339_ms;
use nightshift_engine::api::{
    Cancel, EngineApi, GpuHealthView, HandsOff, HealthState, NodeHealth, Reason, ReleaseHolds,
};

use crate::api::session;
use nightshift_engine::api::{RunOutcome, RunState, RunSummary};
use nightshift_engine::audit::{AuditRecord, RecordKind, data};
use nightshift_engine::config::Role;
use nightshift_proto::{HoldInfo, SettingView};

use crate::AppState;
use crate::auth::COOKIE;
use crate::error::ApiError;
use crate::extract::{Admin, Operator, Viewer};
use crate::html::{PageError, layout, urlencode};
use crate::nodes::{agent_cell, drain_cell, standby_of};
use nightshift_engine::api::{NodeDetail, RunbookDetail, RunsQuery};

/// A time for people: UTC in the page (and its tooltip), turned into the
/// reader's own zone by app.js.
fn time(ms: i64) -> Markup {
    let s = format_rfc3339_ms(ms);
    html! { time datetime=(s) { (&s[..10]) " " (&s[11..19]) "Z" } }
}

fn dur(ms: i64) -> String {
    let s = ms / 1000;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    }
}

fn status_class(r: &RunSummary) -> (&'static str, String) {
    match (r.state, r.outcome) {
        (_, Some(o)) => (
            match o {
                RunOutcome::Succeeded => "ok",
                RunOutcome::Failed | RunOutcome::Interrupted => "bad",
                RunOutcome::Refused | RunOutcome::NeedsPerson => "warn",
                RunOutcome::TimedOut => "timeout",
                RunOutcome::Cancelled | RunOutcome::Skipped => "muted",
            },
            o.words().to_string(),
        ),
        (RunState::PendingApproval, _) => ("pending", "pending approval".into()),
        (RunState::Running, _) => ("running", "running".into()),
        _ => ("pending", "queued".into()),
    }
}

fn badge(r: &RunSummary) -> Markup {
    let (class, text) = status_class(r);
    html! { span class={"badge " (class)} { (text) } }
}

/// What a run did, each effect in its own colour: a drain (out of
/// service), a cap or fan or clock change, a config rolled back or changed,
/// anything else; "nothing" for a finished run that changed nothing.
fn did(r: &RunSummary) -> Markup {
    let class = |d: &str| {
        if d.contains("drained") {
            "did drain"
        } else if matches!(d, "capped" | "fans" | "clocks") {
            "did cap"
        } else if d.contains("rolled back") || d.starts_with("config") {
            "did config"
        } else if matches!(d, "resumed" | "released" | "GPU back") {
            "did back"
        } else {
            "did other"
        }
    };
    html! {
        @for d in &r.did { span class=(class(d)) { (d) } " " }
        @if r.did.is_empty() && r.outcome.is_some() { span.did.none { "nothing" } }
    }
}

fn run_rows(runs: &[RunSummary]) -> Markup {
    html! {
        @for r in runs {
            tr {
                td.nowrap { (time(r.created_ms)) }
                td { a href={"/runs/" (r.id)} { (r.id) } }
                td { a href={"/runbooks/" (r.runbook)} { (r.runbook) } @if let Some(h) = &r.handbook { " " span.tag { (h) } } }
                td.nowrap { (r.target.to_string()) }
                td { (r.trigger) @if r.dry_run { " " span.tag { "dry run" } } }
                td { (badge(r)) }
                td { (did(r)) }
                td.num { (r.actions) }
                td.reason { (r.why) }
            }
        }
        @if runs.is_empty() {
            tr { td colspan="9" .empty { "No runs match." } }
        }
    }
}

/// `/`: runs, newest first, filterable, paginated, live.
pub async fn timeline(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Response, PageError> {
    let get = |k: &str| q.get(k).cloned().filter(|v| !v.is_empty());
    let now = nightshift_proto::clock::Clock::now_ms(s.engine.clock().as_ref());
    let range = get("range").unwrap_or_else(|| "all".into());
    let since_ms = match range.as_str() {
        "1h" => Some(now - 3_600_000),
        "6h" => Some(now - 6 * 3_600_000),
        "24h" => Some(now - 86_400_000),
        "7d" => Some(now - 7 * 86_400_000),
        _ => None,
    };
    let rq = RunsQuery {
        node: get("node"),
        gpu: match get("gpu") {
            Some(g) => {
                Some(g.parse().map_err(|_| ApiError::bad_request(format!("gpu: expected a GPU index, found {g:?}")))?)
            }
            None => None,
        },
        runbook: get("runbook"),
        outcome: get("outcome"),
        state: None,
        since_ms,
        until_ms: None,
        cursor: get("cursor"),
        limit: Some(50),
        shards: None,
        label: get("label"),
    };
    let ha = s.engine.ha_status();
    if ha.backend == "postgres" && get("shards").as_deref() == Some("all") {
        return all_shards_timeline(&s, &who, &rq, &q).await;
    }
    let page = session(&s, &who).runs(rq.clone()).await?;
    if get("partial").is_some() {
        return Ok(run_rows(&page.runs).into_response());
    }
    let nodes = s.engine.node_names();
    let runbooks: Vec<String> = s.engine.runbook_set().names();
    let sel = |k: &str, v: &str| get(k).as_deref() == Some(v);
    let next = page.next_cursor.as_deref().map(|c| older_page(&q, c));
    let pending = session(&s, &who).approvals().await?.len();
    // What people did in the same window (cancels, approvals, releases,
    // drains, resumes, hands-off, mode changes): the night is not only runs.
    let people = crate::browse::search(
        &s,
        nightshift_engine::audit::RecordQuery {
            actor: Some("people".into()),
            node: rq.node.clone(),
            since_ms,
            limit: 40,
            ..Default::default()
        },
    )
    .await?;
    // Their acts, not the runs they started (those are the table below)
    // nor the intent before each result.
    let people: Vec<_> = people
        .records
        .into_iter()
        .filter(|r| match r.kind {
            RecordKind::RunQueued | RecordKind::RunStarted | RecordKind::ActionIntent => false,
            // A run's end is a person's act when they cancelled it.
            RecordKind::RunFinished => r.payload::<data::RunFinished>().is_ok_and(|f| f.outcome == "cancelled"),
            _ => true,
        })
        .take(8)
        .collect();
    let body = html! {
        div.head {
            h1 { "Timeline" }
            span #live.live { "live" }
            @if pending > 0 { a.badge.pending href="/approvals" { (pending) " waiting for approval" } }
            @if let Some(shard) = &ha.shard {
                span.tag { "shard " (shard) " · " (ha.role) }
                a href="/?shards=all" { "all shards →" }
            }
        }
        form.filters method="get" action="/" {
            label { "Node " select name="node" { option value="" { "any" } @for n in &nodes { option value=(n) selected[sel("node", n)] { (n) } } } }
            label { "GPU " input type="number" name="gpu" min="0" max="15" value=[get("gpu")]; }
            label { "Runbook " select name="runbook" { option value="" { "any" } @for r in &runbooks { option value=(r) selected[sel("runbook", r)] { (r) } } } }
            label { "Outcome " select name="outcome" {
                option value="" { "any" }
                @for o in RunOutcome::ALL { option value=(o.as_str()) selected[sel("outcome", o.as_str())] { (o.words()) } }
            } }
            label { "Time " select name="range" {
                @for (v, t) in [("all", "all time"), ("1h", "last hour"), ("6h", "last 6 h"), ("24h", "last 24 h"), ("7d", "last 7 days")] {
                    option value=(v) selected[range == v] { (t) }
                }
            } }
            button type="submit" { "Filter" }
            a href="/" { "clear" }
        }
        @if !people.is_empty() && get("cursor").is_none() {
            details.people open {
                summary { "What people did" @if since_ms.is_some() { " (" (range) ")" } }
                table.people {
                    tbody {
                        @for r in &people {
                            tr {
                                td.nowrap { (crate::browse::time(r.ts_ms)) }
                                td { (r.actor.strip_prefix("user:").unwrap_or(&r.actor)) }
                                td { (crate::browse::summary(r)) }
                                td { @if let Some(n) = &r.node { a href={"/nodes/" (n)} { (n) } @if let Some(g) = r.gpu { " GPU " (g) } } }
                                td { @if let Some(id) = &r.run { a href={"/runs/" (id)} { (id) } } }
                                td { a href={"/audit/records/" (r.seq)} { "#" (r.seq) } }
                            }
                        }
                    }
                }
                p.muted { a href="/audit?actor=people" { "every act by a person →" } }
            }
        }
        div.scroll {
            table.runs data-live=(if get("cursor").is_none() { "1" } else { "" }) {
                thead { tr { th { "Created (UTC)" } th { "Run" } th { "Runbook" } th { "Target" } th { "Trigger" } th { "Status" } th { "Did" } th { "Actions" } th { "Why" } } }
                tbody #runs { (run_rows(&page.runs)) }
            }
        }
        @if let Some(n) = next { p.pager { a href=(n) { "Older runs →" } } }
    };
    Ok(layout("Timeline", "Timeline", Some(&who), body).into_response())
}

/// `/?shards=all` (PostgreSQL): the runs of every shard of the database,
/// filtered in SQL, each linked to its shard's leader (a run page lives on
/// its shard's engines). Not live: reload to refresh.
async fn all_shards_timeline(
    s: &AppState,
    who: &crate::auth::Identity,
    rq: &RunsQuery,
    q: &std::collections::HashMap<String, String>,
) -> Result<Response, PageError> {
    let page = session(s, who)
        .runs_all_shards(rq.clone())
        .await
        .map_err(|e| ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "database", e.message))?;
    let own = s.engine.ha_status().shard.unwrap_or_default();
    let urls: std::collections::HashMap<String, String> =
        session(s, who).ha().await?.shards.unwrap_or_default().into_iter().map(|r| (r.shard, r.url)).collect();
    let link = |shard: &str, id: &str| -> String {
        match urls.get(shard).filter(|_| shard != own) {
            Some(u) if !u.is_empty() => format!("{}/runs/{id}", u.trim_end_matches('/')),
            _ => format!("/runs/{id}"),
        }
    };
    let next = page.next_cursor.as_deref().map(|c| older_page(q, c));
    let body = html! {
        div.head {
            h1 { "Timeline — every shard" }
            a href="/" { "← this shard (" (own) ")" }
        }
        div.scroll {
            table.runs {
                thead { tr { th { "Created (UTC)" } th { "Shard" } th { "Run" } th { "Runbook" } th { "Target" } th { "Trigger" } th { "Status" } th { "Did" } th { "Actions" } th { "Why" } } }
                tbody {
                    @for sr in &page.runs {
                        @let r = &sr.run;
                        tr {
                            td.nowrap { (time(r.created_ms)) }
                            td { (sr.shard) }
                            td { a href=(link(&sr.shard, &r.id)) { (r.id) } }
                            td { (r.runbook) }
                            td.nowrap { (r.target.to_string()) }
                            td { (r.trigger) @if r.dry_run { " " span.tag { "dry run" } } }
                            td { (badge(r)) }
                            td { (did(r)) }
                            td.num { (r.actions) }
                            td.reason { (r.why) }
                        }
                    }
                    @if page.runs.is_empty() { tr { td colspan="10" .empty { "No runs match." } } }
                }
            }
        }
        @if let Some(n) = next { p.pager { a href=(n) { "Older runs →" } } }
    };
    Ok(layout("Timeline", "Timeline", Some(who), body).into_response())
}

/// The timeline's link to the next (older) page: the same filters, this
/// cursor.
fn older_page(q: &std::collections::HashMap<String, String>, cursor: &str) -> String {
    let mut params: Vec<(String, String)> = q
        .iter()
        .filter(|(k, v)| k.as_str() != "cursor" && !v.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    params.push(("cursor".into(), cursor.to_string()));
    params.sort();
    let qs: Vec<String> = params.iter().map(|(k, v)| format!("{k}={}", urlencode(v))).collect();
    format!("/?{}", qs.join("&"))
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// A value for people: `700` not `700.0`, `k: v` pairs, `—` for nothing.
fn compact(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            Some(f) if n.is_f64() => format!("{:.2}", f).trim_end_matches('0').trim_end_matches('.').to_string(),
            _ => n.to_string(),
        },
        Value::Object(m) if m.len() == 1 => {
            let (k, v) = m.iter().next().map(|(k, v)| (k.clone(), v.clone())).unwrap_or_default();
            format!("{k}: {}", compact(&v))
        }
        // The chain's bookkeeping (a summary's hash) is for `verify`, not people.
        Value::Object(m) => m
            .iter()
            .filter(|(k, _)| k.as_str() != "summary_sha256")
            .map(|(k, v)| format!("{k}={}", compact(v)))
            .collect::<Vec<_>>()
            .join(" "),
        Value::Array(a) => format!("[{}]", a.iter().map(compact).collect::<Vec<_>>().join(", ")),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One step of a run: an intent and its result, or a single record.
enum Step<'a> {
    Action { intent: &'a AuditRecord, result: Option<&'a AuditRecord> },
    Other(&'a AuditRecord),
}

fn steps(records: &[AuditRecord]) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    for r in records {
        match r.kind {
            RecordKind::ActionIntent => out.push(Step::Action { intent: r, result: None }),
            RecordKind::ActionResult => {
                let id = r.data.get("action_id");
                let found = out.iter_mut().rev().find_map(|s| match s {
                    Step::Action { intent, result } if intent.data.get("action_id") == id && result.is_none() => {
                        Some(result)
                    }
                    _ => None,
                });
                match found {
                    Some(slot) => *slot = Some(r),
                    None => out.push(Step::Other(r)),
                }
            }
            _ => out.push(Step::Other(r)),
        }
    }
    out
}

/// A value with the unit its key names (`power_limit_watts` → `500 W`).
fn with_unit(key: &str, v: &Value) -> String {
    let n = match v {
        Value::Number(n) => n.as_f64().map(|f| if f.fract() == 0.0 { format!("{f:.0}") } else { format!("{f:.1}") }),
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(if *b { "on".into() } else { "off".into() }),
        Value::Null => Some("none".into()),
        _ => None,
    };
    let Some(n) = n else { return compact(v) };
    let unit = [("_watts", " W"), ("_pct", " %"), ("_c", " °C"), ("_mhz", " MHz"), ("_secs", " s"), ("_mib", " MiB")]
        .iter()
        .find(|(suf, _)| key.ends_with(suf))
        .map(|(_, u)| *u)
        .unwrap_or("");
    format!("{n}{unit}")
}

fn words(key: &str) -> String {
    let k = ["_watts", "_pct", "_c", "_mhz", "_secs", "_mib"]
        .iter()
        .fold(key.to_string(), |k, suf| k.strip_suffix(suf).map(str::to_string).unwrap_or(k));
    k.replace('_', " ")
}

/// An action's result as a sentence: each setting's before → after with
/// its unit, what a release put back, whether the change is held.
fn step_sentence(d: &Value) -> String {
    /// The agent's answer as an action's result keeps it.
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Step {
        before: Value,
        after: Value,
        held: bool,
    }
    /// What a release's answer (`after`) says of each setting.
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Released {
        settings: Vec<Setting>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Setting {
        detail: Option<String>,
    }
    let d: Step = serde_json::from_value(d.clone()).unwrap_or_default();
    let mut parts: Vec<String> = Vec::new();
    let released: Released = serde_json::from_value(d.after.clone()).unwrap_or_default();
    parts.extend(released.settings.into_iter().filter_map(|s| s.detail));
    if parts.is_empty()
        && let Some(after) = d.after.as_object()
    {
        for (k, a) in after {
            if k == "released" || k == "settings" {
                continue;
            }
            match d.before.get(k) {
                Some(b) if b != a => parts.push(format!("{} {} → {}", words(k), with_unit(k, b), with_unit(k, a))),
                Some(_) => parts.push(format!("{} stays {}", words(k), with_unit(k, a))),
                None => parts.push(format!("{} {}", words(k), with_unit(k, a))),
            }
        }
    }
    if parts.is_empty() && d.after.is_null() && d.before.is_null() {
        return String::new();
    }
    if parts.is_empty() {
        parts.push(format!("{} → {}", compact(&d.before), compact(&d.after)));
    }
    let mut s = parts.join("; ");
    if d.held {
        s.push_str(" (held until the run releases it)");
    }
    s
}

/// A text field of the event that started a run (its shape is the
/// trigger's: an alert's labels, a fire's metric, a fault's kind).
fn event_field<'a>(event: &'a Value, field: &str) -> Option<&'a str> {
    event.get(field).and_then(Value::as_str)
}

/// An `action_result` record's payload.
fn action_result(r: &AuditRecord) -> Option<data::ActionResult> {
    (r.kind == RecordKind::ActionResult).then(|| r.payload().ok()).flatten()
}

/// A record that is not an action, in words: its text, reason or detail,
/// else how it ended, else its fields.
fn other_step_text(r: &AuditRecord) -> String {
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Said {
        text: Option<String>,
        reason: Option<String>,
        detail: Option<String>,
        outcome: Option<String>,
        error: Option<String>,
    }
    let s: Said = serde_json::from_value(r.data.clone()).unwrap_or_default();
    match (s.text, s.reason, s.detail, s.outcome) {
        (Some(t), ..) | (None, Some(t), ..) | (None, None, Some(t), _) => t,
        (None, None, None, Some(o)) => {
            let o = o.replace('_', " ");
            match s.error {
                Some(e) => format!("{o} — {e}"),
                None => o,
            }
        }
        _ => compact(&r.data),
    }
}

/// A `hold_ended` record in one line: what, how it ended, what became of
/// the setting.
fn hold_ended_text(r: &AuditRecord) -> String {
    let d: data::HoldEnded = r.payload().unwrap_or_default();
    let or_q = |s: &str| if s.is_empty() { "?".to_string() } else { s.to_string() };
    let how = match d.how.as_str() {
        "expired" => "its lease ran out".to_string(),
        "released" => format!("released by {}", or_q(&d.by)),
        "taken_over" => "a person changed the setting by hand".to_string(),
        "superseded" => "its config version was marked bad".to_string(),
        other => or_q(other),
    };
    format!(
        "{} hold {} ended: {how}; {} ({})",
        or_q(&d.setting),
        or_q(&d.value),
        d.outcome.as_str().unwrap_or("?").replace('_', " "),
        or_q(&d.now),
    )
}

/// What a run held: kept on purpose, left in effect by mistake, and each
/// hold's end as its agent reported it.
fn run_holds(run: &RunSummary, records: &[AuditRecord]) -> Markup {
    let ended: Vec<&AuditRecord> = records.iter().filter(|r| r.kind == RecordKind::HoldEnded).collect();
    let placed = records
        .iter()
        .filter(|r| action_result(r).is_some_and(|a| a.more.get("held") == Some(&Value::Bool(true))))
        .count();
    html! {
        @if placed > 0 || !ended.is_empty() || !run.holds_kept.is_empty() || !run.holds_left.is_empty() {
            h2 { "Holds" }
            ul.holds {
                li { (placed) " hold(s) placed" @if run.outcome.is_some() && run.holds_kept.is_empty() && run.holds_left.is_empty() { "; none left in effect when the run ended" } }
                @for h in &run.holds_kept { li { span.badge.warn { "kept on purpose" } " " (h) } }
                @for h in &run.holds_left { li { span.badge.bad { "still in effect: not released" } " " (h) } }
                @for r in &ended { li { span.badge.muted { "ended" } " " (time(r.ts_ms)) " — " (hold_ended_text(r)) } }
            }
        }
    }
}

/// The run's picture: its trigger metric and, for a GPU, temperature and
/// power limit, from ten minutes before the event to five after the end,
/// with each step and each hold's end marked.
fn run_charts(s: &AppState, run: &RunSummary, records: &[AuditRecord]) -> Markup {
    use crate::chart::{Mark, Series, chart};
    use nightshift_engine::api::{ids, metric, metric_id};
    let Some(node) = run.target.node.clone() else { return html! {} };
    let t0 = if run.event_ts_ms > 0 { run.event_ts_ms } else { run.created_ms };
    let end = run.finished_ms.unwrap_or_else(|| s.engine.clock().now_ms());
    let (from, to) = (t0 - 10 * 60_000, end + 5 * 60_000);
    let gpu = run.target.gpu;
    let series = |m, label: &str, unit: &'static str, class: &'static str, g: Option<u32>| Series {
        label: label.into(),
        unit,
        points: s.engine.series(&node, g, m, from, to),
        class,
    };
    let mut marks: Vec<Mark> = records
        .iter()
        .filter_map(|r| match r.kind {
            RecordKind::RunStarted => Some(Mark { ts_ms: r.ts_ms, label: "start".into(), class: "start" }),
            RecordKind::RunFinished => Some(Mark { ts_ms: r.ts_ms, label: "end".into(), class: "end" }),
            RecordKind::ActionResult => {
                action_result(r).filter(|a| a.applied).map(|a| Mark { ts_ms: r.ts_ms, label: a.op, class: "action" })
            }
            RecordKind::HoldEnded => Some(Mark { ts_ms: r.ts_ms, label: "hold ended".into(), class: "end" }),
            _ => None,
        })
        .collect();
    marks.sort_by_key(|m| m.ts_ms);
    let trigger = event_field(&run.event, "metric").and_then(metric_id);
    html! {
        @if let Some(g) = gpu {
            (chart(
                &format!("{node} GPU {g}: temperature and power limit"),
                &[series(ids::TEMPERATURE, "temperature", "°C", "temp", Some(g)), series(ids::POWER_LIMIT, "power limit", "W", "limit", Some(g))],
                &marks, from, to, t0,
            ))
        }
        @if let (Some(g), Some(fault)) = (gpu, event_field(&run.event, "fault").filter(|_| run.trigger == "fault")) {
            (chart(
                &format!("{node} GPU {g}: fault counters (the {fault} fault)"),
                &[series(ids::ECC_DBE, "double-bit ECC", "count", "fault", Some(g)), series(ids::XID_EVENTS, "fatal XIDs", "count", "xid", Some(g))],
                &marks, from, to, t0,
            ))
        }
        @if let Some(m) = trigger.filter(|m| *m != ids::TEMPERATURE || gpu.is_none()) {
            @let def = metric(m);
            @let g = if def.gpu_scoped { gpu } else { None };
            (chart(
                &format!("{node}: {} (the trigger)", def.name),
                &[series(m, def.name, def.unit, "other", g)],
                &marks, from, to, t0,
            ))
        }
    }
}

/// `/runs/{id}`: what happened, why, and with what result.
pub async fn run_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let nightshift_engine::api::RunDetail { run, records } = session(&s, &who).run(&id).await?;
    let t0 = run.created_ms;
    let can_decide = run.state == RunState::PendingApproval && who.role >= Role::Operator;
    let waited_for = records
        .iter()
        .find(|r| r.kind == RecordKind::RunStarted)
        .and_then(|r| r.payload::<data::RunStarted>().ok())
        .and_then(|p| p.waited_for.as_str().map(str::to_string));
    let grafana = match (&s.engine.config().grafana, &run.target.node) {
        (Some(g), Some(node)) => {
            let end = run.finished_ms.unwrap_or_else(|| s.engine.clock().now_ms());
            let from = run.event_ts_ms.min(run.created_ms).max(0).saturating_sub(15 * 60_000);
            Some(g.link(node, run.target.gpu, &from.to_string(), &(end + 15 * 60_000).to_string()))
        }
        _ => None,
    };
    let body = html! {
        div.head {
            h1 { "Run " (run.id) }
            (badge(&run))
            @if run.shadow { span.tag title="its runbook is in shadow mode: every action was a dry run, no one was notified" { "shadow" } }
            @else if run.dry_run { span.tag { "dry run" } }
            @if let Some(u) = &grafana { a.grafana href=(u) target="_blank" rel="noopener" { "Grafana ↗" } }
        }
        p.why { (run.why) }
        @if who.role >= Role::Operator && run.outcome.is_none() {
            form.inline.cancel method="post" action={"/ui/runs/" (run.id) "/cancel"}
                data-confirm={"Cancel run " (run.id) "? A running run stops at its next step and gives back its holds."} {
                input type="text" name="reason" maxlength="500" placeholder="why (kept in the audit)" aria-label="why you cancel it";
                button.bad type="submit" { "Cancel run" }
            }
        }
        @if can_decide {
            div.decide {
                form method="post" action={"/ui/runs/" (run.id) "/approve"} { button.ok type="submit" { "Approve" } }
                form method="post" action={"/ui/runs/" (run.id) "/reject"} {
                    input type="text" name="reason" placeholder="why not" required;
                    button.bad type="submit" { "Reject" }
                }
            }
        }
        div.grid {
            section {
                h2 { "Run" }
                table.kv {
                    tr { th { "Runbook" } td { a href={"/runbooks/" (run.runbook)} { (run.runbook) } @if let Some(h) = &run.handbook { " " span.tag { (h) } } } }
                    tr { th { "Target" } td { @if let Some(n) = &run.target.node { a href={"/nodes/" (n)} { (run.target.to_string()) } } @else { (run.target.to_string()) } } }
                    tr { th { "Trigger" } td { (run.trigger) } }
                    @if let Some(n) = records.iter().find(|r| r.data.get("alert_resolved").is_some()) {
                        tr { th { "Alert" } td #alert-resolved { "resolved " (time(n.ts_ms)) } }
                    }
                    tr { th { "Requested by" } td { (run.requested_by) } }
                    tr { th { "Created" } td { (time(run.created_ms)) } }
                    @if let Some(w) = run.waiting_for.as_deref().filter(|_| run.started_ms.is_none()) { tr { th { "Waiting for" } td { (w) } } }
                    @if let Some(t) = run.started_ms { tr { th { "Started" } td { (time(t)) " (+" (dur(t - t0)) ")" @if let Some(w) = &waited_for { " — waited for " (w) } } } }
                    @if let Some(t) = run.finished_ms { tr { th { "Finished" } td { (time(t)) " (took " (dur(t - run.started_ms.unwrap_or(t0))) ")" } } }
                    tr { th { "Actions" } td { (run.actions) } }
                    tr { th { "Did" } td { (did(&run)) } }
                    @if let Some(e) = &run.error { tr { th { "Error" } td.error { (e) } } }
                    @for a in &run.approvals {
                        tr { th { @if a.approved { "Approved" } @else { "Rejected" } } td { (a.by) " at " (time(a.at_ms)) @if let Some(r) = &a.reason { " — " (r) } } }
                    }
                }
                @if !run.params.is_empty() {
                    h3 { "Parameters" }
                    table.kv { @for (k, v) in &run.params { tr { th { (k) } td { (serde_json::to_string(v).unwrap_or_default()) } } } }
                }
            }
            section {
                h2 { "Triggering event" }
                @if run.event_ts_ms > 0 { p { "At " (time(run.event_ts_ms)) @if run.created_ms > run.event_ts_ms { " (" (dur(run.created_ms - run.event_ts_ms)) " before the run was created)" } } }
                pre { (pretty(&run.event)) }
            }
        }
        (run_charts(&s, &run, &records))
        (run_holds(&run, &records))
        h2 { "Steps" }
        div.scroll {
            table.steps {
                thead { tr { th { "+time" } th { "Step" } th { "Node" } th { "Result" } th { "Before → after" } th { "Took" } } }
                tbody {
                    @for step in steps(&records) {
                        @match step {
                            Step::Action { intent, result } => {
                                @let i: data::ActionIntent = intent.payload().unwrap_or_default();
                                tr.action {
                                    td.nowrap { "+" (dur(intent.ts_ms - t0)) }
                                    td { strong { (if i.op.is_empty() { "?" } else { &i.op }) } " " code { (compact(&i.args)) } @if i.dry_run { " " span.tag { "dry run" } } }
                                    td { (intent.node.clone().unwrap_or_default()) @if let Some(g) = intent.gpu { "/gpu" (g) } }
                                    @match result {
                                        Some(r) => {
                                            @let a = action_result(r).unwrap_or_default();
                                            td { span class={"badge " (if a.ok { if a.applied { "ok" } else { "muted" } } else { "bad" })} {
                                                (if a.outcome.is_empty() { "?".to_string() } else { a.outcome.replace('_', " ") })
                                            }
                                            @if let Some(d) = a.more.get("detail").and_then(Value::as_str) { " " small { (d) } }
                                            @if let Some(e) = &a.error { " " small.error { (e) } }
                                            }
                                            td {
                                                (step_sentence(&r.data))
                                                details.raw { summary { "JSON" } pre { (pretty(&r.data)) } }
                                            }
                                            td.nowrap { (a.duration_ms.map(|ms| format!("{ms} ms")).unwrap_or_default()) }
                                        }
                                        None => { td { span.badge.running { "no result (in flight or interrupted)" } } td {} td {} }
                                    }
                                }
                            }
                            Step::Other(r) => {
                                tr class=(r.kind.as_str()) {
                                    td.nowrap { "+" (dur(r.ts_ms - t0)) }
                                    td { (r.kind.as_str().replace('_', " ")) }
                                    td { (r.node.clone().unwrap_or_default()) }
                                    td colspan="3" {
                                        @if r.kind == RecordKind::HoldEnded { (hold_ended_text(r)) }
                                        @else { (other_step_text(r)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        p.muted { "Audit records " (records.first().map(|r| r.seq).unwrap_or(0)) "–" (records.last().map(|r| r.seq).unwrap_or(0)) ". " a href={"/api/v1/runs/" (run.id)} { "JSON" } }
    };
    Ok(layout(&format!("Run {}", run.id), "Timeline", Some(&who), body).into_response())
}

/// `/nodes/{name}`.
/// The node's RMA evidence: each bundle, its hash on the chain, and its
/// files to download (copied off the node through the engine; check a
/// copy with `nightshift audit verify --evidence DIR`).
fn evidence_section(node: &str, records: &[AuditRecord]) -> Markup {
    html! {
        @if !records.is_empty() {
            h2 { "RMA evidence" }
            table {
                tr { th { "Record" } th { "GPU" } th { "Bundle" } th { "Files" } }
                @for r in records {
                    @let d: data::EvidenceCollected = r.payload().unwrap_or_default();
                    @let bundle = d.bundle.as_str();
                    tr {
                        td.num { a href=(format!("/audit/records/{}", r.seq)) { "#" (r.seq) } }
                        td { @if let Some(g) = r.gpu { (g) } }
                        @if let Some(e) = &d.error {
                            td colspan="2" { small.error { "not collected: " (e) } }
                        } @else {
                            td { (bundle) br; small { "sha256 " (d.sha256) } }
                            td {
                                a href=(format!("/api/v1/nodes/{}/evidence/{}/manifest.json", urlencode(node), urlencode(bundle))) { "manifest.json" }
                                @for f in &d.files {
                                    br;
                                    a href=(format!("/api/v1/nodes/{}/evidence/{}/{}", urlencode(node), urlencode(bundle), urlencode(&f.name))) { (f.name) }
                                    " " small { (f.bytes) " bytes" @if let Some(e) = &f.error { " — " (e) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub async fn node_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let NodeDetail { node: n, health, recent_runs } = session(&s, &who).node(&name).await?;
    let health = health.unwrap_or_default();
    let standby = standby_of(&s);
    let cols = [
        "temperature_c",
        "power_watts",
        "power_limit_watts",
        "fan_pct",
        "util_pct",
        "mem_used_pct",
        "mem_fragmentation_pct",
        "ecc_dbe_total",
        "xid_last",
    ];
    let inv = n.state.inventory.clone();
    let held = held_settings(&session(&s, &who), &name, &n.holds).await;
    // The node's RMA evidence bundles among its last 500 records, newest
    // first (five at most; `nightshift agents evidence NODE` lists all).
    let evidence: Vec<AuditRecord> = s
        .engine
        .audit()
        .node_records(&name, 500)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.kind == RecordKind::EvidenceCollected)
        .take(5)
        .collect();
    let now_ms = s.engine.clock().now_ms();
    let body = html! {
        div.head {
            h1 { (n.name) }
            @if n.standby { span.tag { "standby" } }
            @if let Some(g) = &s.engine.config().grafana { a.grafana href=(g.link(&n.name, None, "now-6h", "now")) target="_blank" rel="noopener" { "Grafana ↗" } }
        }
        div.grid {
            section {
                h2 { "State" }
                table.kv {
                    tr { th { "Address" } td { code { (n.address) } } }
                    tr { th { "Agent" } td { (agent_cell(n.state.connected, standby.as_deref())) @if let Some(e) = &n.state.last_error { " " small.error { (e) } } } }
                    tr { th { "Drain" } td { (drain_cell(&n.state.drained, &n.state.drain_reason, n.drained_by_person, standby.as_deref())) } }
                    @if let Some(why) = &n.state.state_degraded {
                        tr { th { "Agent state" } td { span.badge.bad { "degraded" } " " small.error { (why) } } }
                    }
                    tr { th { "Hands-off" } td {
                        @if n.state.agent_hands_off { span.badge.warn { "marker on the node" } " " }
                        @if let Some((by, why)) = &n.state.engine_hands_off { span.badge.warn { "set by " (by) } " " small { (why) } @if let Some(u) = n.state.engine_hands_off_until_ms { " " small { "until " (nightshift_engine::api::format_rfc3339_ms(u)) } } }
                        @if let Some(w) = &n.state.maintenance { span.badge.warn { "maintenance window " (w.id) } " " small { (w.by) ": " (w.reason) " until " (nightshift_engine::api::format_rfc3339_ms(w.ends_ms)) } }
                        @if !n.state.hands_off() { span.muted { "no" } }
                    } }
                    tr { th { "Labels" } td { @for (k, v) in &n.labels { span.tag { (k) "=" (v) } " " } } }
                    @for (k, v) in &n.state.annotations { tr { th { "Note: " (k) } td { (v) } } }
                    @if let Some(i) = &inv { tr { th { "Backend" } td { (i.backend) " · scheduler " (i.scheduler) " · agent " (i.agent_version) } } }
                }
                @if who.role >= Role::Admin {
                    form.inline.hands-off method="post" action={"/ui/nodes/" (n.name) "/hands-off"}
                        data-confirm={"Change hands-off on " (n.name) "? While it is set nightshift changes nothing on the node."} {
                        @if n.state.engine_hands_off.is_some() {
                            input type="hidden" name="hands_off" value="false";
                            button type="submit" { "Clear hands-off" }
                        } @else {
                            input type="hidden" name="hands_off" value="true";
                            input type="text" name="reason" placeholder="maintenance reason" required;
                            button.bad type="submit" { "Set hands-off" }
                        }
                    }
                }
            }
            section {
                h2 { "Node readings" }
                table.kv { @for (k, v) in &n.node_metrics { tr { th { (k) } td.num { (format!("{v:.2}")) } } } }
            }
        }
        (health_section(&health))
        (evidence_section(&name, &evidence))
        h2 { "GPUs" }
        div.scroll {
            table {
                thead { tr { th { "GPU" } th { "Model" } @for c in cols { th { (c.replace('_', " ")) } } } }
                tbody {
                    @for (i, g) in n.gpus.iter().enumerate() {
                        tr {
                            td { (i) }
                            td { (inv.as_ref().and_then(|x| x.gpus.get(i)).map(|x| x.name.clone()).unwrap_or_default()) }
                            @for c in cols {
                                @let v = g.get(&format!("gpu.{c}"));
                                td.num class=(if c == "temperature_c" && v.is_some_and(|t| *t >= 85.0) { "hot" } else { "" }) {
                                    (v.map(|v| if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") }).unwrap_or_else(|| "—".into()))
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Last hour" }
        @for g in 0..(n.gpus.len() as u32) {
            (crate::chart::chart(
                &format!("GPU {g}: temperature and power limit"),
                &[
                    crate::chart::Series { label: "temperature".into(), unit: "°C", points: s.engine.series(&name, Some(g), nightshift_engine::api::ids::TEMPERATURE, now_ms - 3_600_000, now_ms), class: "temp" },
                    crate::chart::Series { label: "power limit".into(), unit: "W", points: s.engine.series(&name, Some(g), nightshift_engine::api::ids::POWER_LIMIT, now_ms - 3_600_000, now_ms), class: "limit" },
                ],
                &recent_runs.iter().filter(|r| r.target.gpu.is_none_or(|x| x == g)).map(|r| crate::chart::Mark { ts_ms: r.created_ms, label: r.runbook.clone(), class: "action" }).collect::<Vec<_>>(),
                now_ms - 3_600_000, now_ms, now_ms,
            ))
        }
        @for g in 0..(n.gpus.len() as u32) {
            @let dbe = s.engine.series(&name, Some(g), nightshift_engine::api::ids::ECC_DBE, now_ms - 3_600_000, now_ms);
            @let xid = s.engine.series(&name, Some(g), nightshift_engine::api::ids::XID_EVENTS, now_ms - 3_600_000, now_ms);
            // A counter that never moved draws a flat zero line: only GPUs with a fault in the hour get a chart.
            @if dbe.iter().chain(&xid).any(|p| p.1 > 0.0) {
                div.faults id={"faults-gpu-" (g)} { (crate::chart::chart(
                    &format!("GPU {g}: fault counters"),
                    &[
                        crate::chart::Series { label: "double-bit ECC".into(), unit: "count", points: dbe, class: "fault" },
                        crate::chart::Series { label: "fatal XIDs".into(), unit: "count", points: xid, class: "xid" },
                    ],
                    &fault_marks(&health, g),
                    now_ms - 3_600_000, now_ms, now_ms,
                )) }
            }
        }
        h2 { "Holds in effect" }
        (holds_table(&held, now_ms, (who.role >= Role::Operator).then_some(name.as_str())))
        @if who.role >= Role::Operator && n.state.drained {
            form.inline.resume method="post" action={"/ui/nodes/" (n.name) "/resume"}
                data-confirm={"Put " (n.name) " back into service as you? Every drain on it ends, a repair or RMA drain too."} {
                input type="text" name="reason" placeholder="why it can serve again" required;
                button.bad type="submit" { "Resume node" }
            }
        }
        h2 { "Recent runs" }
        div.scroll { table.runs { tbody { (run_rows(&recent_runs)) } } }
    };
    Ok(layout(&name, "Nodes", Some(&who), body).into_response())
}

/// Marks for a GPU's health changes (faulted, awaiting repair, …) from the
/// node's health view.
fn fault_marks(health: &NodeHealth, gpu: u32) -> Vec<crate::chart::Mark> {
    let mut out = Vec::new();
    for g in health.gpus.iter().filter(|g| g.gpu == gpu) {
        // The lifecycle's moments (faulted, drained, …), else the state's start.
        if let Some(l) = g.lifecycle.as_ref().map(|l| l.timestamps) {
            let moments = [
                ("seen", Some(l.seen_ms)),
                ("quarantined", l.quarantined_ms),
                ("requeued", l.requeued_ms),
                ("repaired", l.repaired_ms),
                ("verified", l.verified_ms),
            ];
            for (label, ts) in moments {
                if let Some(ts) = ts.filter(|t| *t > 0) {
                    out.push(crate::chart::Mark { ts_ms: ts, label: label.into(), class: "action" });
                }
            }
        }
        if out.is_empty() && g.since_ms > 0 && g.state != HealthState::Healthy {
            out.push(crate::chart::Mark {
                ts_ms: g.since_ms,
                label: g.state.as_str().replace('_', " "),
                class: "action",
            });
        }
    }
    out.sort_by_key(|m| m.ts_ms);
    out
}

/// What is held on a node, from its agent (baselines included); when the
/// agent does not answer, the holds its last telemetry reported, without
/// baselines.
async fn held_settings(api: &nightshift_engine::api::Session, node: &str, reported: &[HoldInfo]) -> Vec<SettingView> {
    if let Ok(held) = api.holds(node).await {
        return held.settings;
    }
    let mut out: Vec<SettingView> = Vec::new();
    for h in reported {
        match out.iter_mut().find(|v| v.setting == h.setting) {
            Some(v) => v.holds.push(h.clone()),
            None => out.push(SettingView {
                setting: h.setting.clone(),
                baseline: h.value.clone(),
                effective: h.value.clone(),
                drifted: Some("agent unreachable: baseline unknown".into()),
                holds: vec![h.clone()],
                reapplied: None,
            }),
        }
    }
    out
}

/// The holds on a node; with `release`, each row has a release button
/// (an operator's: sent to the agent as them, audited) for node `node`.
fn holds_table(held: &[SettingView], now_ms: i64, release: Option<&str>) -> Markup {
    html! {
        @if held.is_empty() {
            p.muted { "None: every setting is as the device had it." }
        } @else {
            div.scroll { table.holds {
                thead { tr { th { "Setting" } th { "Hold" } th { "Owner" } th { "Lease" } th { "In effect" } th { "Baseline" } @if release.is_some() { th { "" } } } }
                tbody {
                    @for v in held {
                        @for h in &v.holds {
                            tr {
                                td { (v.setting.to_string()) }
                                td { (h.value.to_string()) br; small.muted { (h.reason) } }
                                td { @if h.owner.starts_with('r') && !h.owner.contains(':') { a href={"/runs/" (h.owner)} { (h.owner) } } @else { (h.owner) } }
                                td {
                                    @match h.expires_at_ms {
                                        None => span.badge.warn { "sticky: a person releases it" },
                                        Some(t) => { (dur((t - now_ms).max(0))) " left" @if h.kept { " · kept past its run" } },
                                    }
                                }
                                td {
                                    @if let Some(d) = &v.drifted { span.badge.warn { "not in force" } " " small { (d) } }
                                    @else {
                                        (v.effective.to_string())
                                        @if let Some(r) = &v.reapplied {
                                            br; span.badge.muted { "re-applied" } " " small { "found at " (r.found.to_string()) " (a reset or reboot) " (dur((now_ms - r.at_ms).max(0))) " ago" }
                                        }
                                    }
                                }
                                td { (v.baseline.to_string()) }
                                @if let Some(node) = release {
                                    td {
                                        form.inline.release method="post" action={"/ui/nodes/" (node) "/holds/release"}
                                            data-confirm={"Release " (h.owner) "'s hold on " (v.setting.to_string()) " (" (h.value.to_string()) ") as you? It is audited."} {
                                            input type="hidden" name="hold" value=(h.id);
                                            input type="text" name="reason" placeholder="why" required;
                                            button.bad type="submit" { "Release" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

/// `/runbooks`.
pub async fn runbooks_page(State(s): State<AppState>, Viewer(who): Viewer) -> Result<Response, PageError> {
    let set = session(&s, &who).runbooks().await?;
    let body = html! {
        h1 { "Runbooks" }
        @if !set.errors.is_empty() {
            div.errors { h3 { "Not loaded" } ul { @for e in &set.errors { li { code { (e) } } } } }
        }
        div.scroll {
            table {
                thead { tr { th { "Row" } th { "Runbook" } th { "Trigger" } th { "Scope" } th { "What it does" } } }
                tbody {
                    @for r in &set.runbooks {
                        tr {
                            td { (r.handbook.clone().unwrap_or_default()) }
                            td { a href={"/runbooks/" (r.name)} { (r.name) } }
                            td { (r.trigger) }
                            td { (r.scope) }
                            td { (r.description) }
                        }
                    }
                }
            }
        }
    };
    Ok(layout("Runbooks", "Runbooks", Some(&who), body).into_response())
}

/// `/runbooks/{name}`.
/// `/runbooks/{name}/shadow`: what a shadow runbook would have done, and
/// what happened on each target afterwards.
pub async fn shadow_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    // The last week, as the API's default.
    let report = session(&s, &who).shadow_report(&name, None, None).await?;
    let (fires, mode) = (report.fires, report.mode);
    let body = html! {
        div.head { h1 { "Shadow report: " a href={"/runbooks/" (name)} { (name) } } span.tag { (mode.as_str()) " mode now" } }
        p.muted { "The last 7 days. A shadow run goes through admission as a real one would and sends every action to the agent as a dry run: the agent's envelope, rate limits and hands-off answer; nothing changes and no one is notified. Promote with " code { "nightshift runbooks promote " (name) " --reason …" } " (admin)." }
        @if fires.is_empty() { p.empty { "No shadow runs in the last 7 days." } }
        @for f in &fires {
            div.card {
                div.head { h2 { a href={"/runs/" (f.run)} { (f.run) } } span.tag { (f.outcome.clone().unwrap_or_else(|| "running".into())) } }
                p { (time(f.ts_ms)) " — " strong { (f.target) } " — " (f.why) }
                @if let Some(a) = &f.would_need_approval { p.warn { "Would have waited for approval: " (a) } }
                @if !f.would_act.is_empty() {
                    table {
                        thead { tr { th { "Would" } th { "Where" } th { "Agent's answer" } } }
                        tbody {
                            @for w in &f.would_act {
                                tr {
                                    td { strong { (w.op) } " " code { (compact(&w.args)) } }
                                    td { (w.node.clone().unwrap_or_default()) @if let Some(g) = w.gpu { "/gpu" (g) } }
                                    td { span class={"badge " (if w.agent_ok { "ok" } else { "bad" })} { (w.answer) } }
                                }
                            }
                        }
                    }
                }
                @for r in &f.refusals { p.error { "Refused by the engine: " (r) } }
                @if !f.afterwards.is_empty() {
                    h3 { "Afterwards" }
                    ul { @for l in &f.afterwards { li { (l) } } }
                }
            }
        }
    };
    Ok(layout(&format!("Shadow report {name}"), "Runbooks", Some(&who), body).into_response())
}

pub async fn runbook_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let RunbookDetail { runbook: rb, recent_runs } = session(&s, &who).runbook(&name).await?;
    let manifest = std::fs::read_to_string(&rb.manifest_path).unwrap_or_else(|_| pretty(&rb.manifest));
    let body = html! {
        div.head {
            h1 { (rb.name) }
            @if let Some(h) = &rb.handbook { span.tag { (h) } }
            span class={"tag mode-" (rb.mode)} { (rb.mode) " mode" }
            @if rb.mode == "shadow" { a href={"/runbooks/" (rb.name) "/shadow"} { "shadow report" } }
        }
        p { (rb.description) }
        div.grid {
            section {
                h2 { "Manifest" } p.muted { code { (rb.manifest_path) } }
                pre.code { (manifest) }
            }
            section {
                h2 { "Script" } p.muted { code { (rb.script_path) } }
                pre.code.lines {
                    @for (i, line) in rb.script.lines().enumerate() {
                        span.ln { (i + 1) } (line) "\n"
                    }
                }
            }
        }
        h2 { "Recent runs" }
        div.scroll { table.runs { tbody { (run_rows(&recent_runs)) } } }
    };
    Ok(layout(&name, "Runbooks", Some(&who), body).into_response())
}

/// `/approvals`.
pub async fn approvals_page(State(s): State<AppState>, Viewer(who): Viewer) -> Result<Response, PageError> {
    let pending = session(&s, &who).approvals().await?;
    let set = s.engine.runbook_set();
    let now_ms = s.engine.clock().now_ms();
    // What each run asks: the request record (reason, expiry, nodes it would
    // change) and the runbook's own description.
    let asks: Vec<(Option<data::ApprovalRequested>, i64, String)> = pending
        .iter()
        .map(|r| {
            let rec = s
                .engine
                .run_records(&r.id)
                .ok()
                .and_then(|rs| rs.into_iter().rev().find(|x| x.kind == RecordKind::ApprovalRequested));
            let ask = rec.as_ref().and_then(|x| x.payload::<data::ApprovalRequested>().ok());
            let expires = rec.as_ref().zip(ask.as_ref()).map_or(0, |(x, a)| {
                x.ts_ms.saturating_add(i64::try_from(a.expires_in_secs).unwrap_or(i64::MAX).saturating_mul(1000))
            });
            let desc = set.get(&r.runbook).map(|(_, rb)| rb.manifest.description.clone()).unwrap_or_default();
            (ask, expires, desc)
        })
        .collect();
    let body = html! {
        h1 { "Approvals" }
        @if pending.is_empty() { p.empty { "Nothing is waiting for approval." } }
        @for (r, (ask, expires, desc)) in pending.iter().zip(&asks) {
            div.card {
                div.head { h2 { a href={"/runs/" (r.id)} { (r.id) } } (badge(r)) }
                p { strong { (r.runbook) } " on " (r.target.to_string()) " — requested by " strong { (r.requested_by) } " at " (time(r.created_ms)) }
                p.why { (r.why) }
                table.kv {
                    tr { th { "Plan" } td { (desc) } }
                    @if let Some(d) = &r.runbook_digest { tr { th { "Runbook version" } td { code title=(d) { (d.chars().take(12).collect::<String>()) } " — approving runs exactly this version; if the runbook changes before it starts, the run is refused" } } }
                    @if let Some(a) = ask { tr { th { "Needs approval because" } td { (a.reason) } } }
                    @if let Some(a) = ask { tr { th { "Nodes it may change" } td { (a.nodes_changed) } } }
                    tr { th { "Mode" } td { @if r.dry_run { "dry run: checks every action, changes nothing" } @else { "live: its actions change the nodes" } } }
                    @if !r.params.is_empty() { tr { th { "Parameters" } td { code { @for (k, v) in &r.params { (k) "=" (serde_json::to_string(v).unwrap_or_default()) " " } } } } }
                    @if *expires > 0 { tr { th { "Expires" } td { (time(*expires)) " (in " (dur((*expires - now_ms).max(0))) "; then it is cancelled)" } } }
                }
                @if who.role >= Role::Operator {
                    div.decide {
                        form method="post" action={"/ui/runs/" (r.id) "/approve"} { button.ok type="submit" { "Approve" } }
                        form method="post" action={"/ui/runs/" (r.id) "/reject"} {
                            input type="text" name="reason" placeholder="why not" required;
                            button.bad type="submit" { "Reject" }
                        }
                    }
                } @else { p.muted { "Operators can approve or reject." } }
            }
        }
    };
    Ok(layout("Approvals", "Approvals", Some(&who), body).into_response())
}

/// `/login`.
pub async fn login_page() -> Response {
    layout(
        "Log in",
        "",
        None,
        html! {
            h1 { "Log in" }
            form.login method="post" action="/login" {
                label { "API token " input type="password" name="token" autocomplete="current-password" required; }
                button type="submit" { "Log in" }
            }
            p.muted { "You get a session (a same-site, HTTP-only cookie holding a random id, not the token) for 12 hours." }
        },
    )
    .into_response()
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

pub async fn login(State(s): State<AppState>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if crate::auth::login_from_another_site(&headers) {
        return PageError(ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            "a login must come from this site's own login page, found a form posted by another site",
        ))
        .into_response();
    }
    let secure = s.engine.config().auth.secure_cookies;
    let mut h = HeaderMap::new();
    if let Ok(v) = format!("Bearer {}", f.token).parse() {
        h.insert(header::AUTHORIZATION, v);
    }
    match s.auth().identify(&h) {
        Ok(_) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_string()),
                (
                    header::SET_COOKIE,
                    format!(
                        "{COOKIE}={}; Max-Age={}; {}",
                        s.sessions.start(&f.token),
                        crate::auth::SESSION_SECS,
                        crate::auth::cookie_attrs(secure)
                    ),
                ),
            ],
        )
            .into_response(),
        Err(e) => PageError(e).into_response(),
    }
}

pub async fn logout(State(s): State<AppState>, headers: HeaderMap) -> Response {
    crate::auth::end_session(&s.sessions, &headers);
    let attrs = crate::auth::cookie_attrs(s.engine.config().auth.secure_cookies);
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, "/login".to_string()), (header::SET_COOKIE, format!("{COOKIE}=; Max-Age=0; {attrs}"))],
    )
        .into_response()
}

#[derive(Deserialize)]
pub struct RejectForm {
    reason: String,
}

pub async fn ui_approve(
    State(s): State<AppState>,
    Operator(who): Operator,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    session(&s, &who).approve(&id).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

pub async fn ui_reject(
    State(s): State<AppState>,
    Operator(who): Operator,
    Path(id): Path<String>,
    Form(f): Form<RejectForm>,
) -> Result<Response, PageError> {
    session(&s, &who).reject(&id, Reason { reason: f.reason }).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

#[derive(Deserialize)]
pub struct HandsOffForm {
    hands_off: bool,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
pub struct ReleaseForm {
    hold: String,
    reason: String,
}

/// The node page's release button (operator).
pub async fn ui_release(
    State(s): State<AppState>,
    Operator(who): Operator,
    Path(name): Path<String>,
    Form(f): Form<ReleaseForm>,
) -> Result<Response, PageError> {
    let body = ReleaseHolds { hold: Some(f.hold), reason: f.reason, ..Default::default() };
    control_page(&name, session(&s, &who).release(&name, body).await?)
}

#[derive(Deserialize)]
pub struct ResumeForm {
    reason: String,
}

/// The node page's resume button (operator).
pub async fn ui_resume(
    State(s): State<AppState>,
    Operator(who): Operator,
    Path(name): Path<String>,
    Form(f): Form<ResumeForm>,
) -> Result<Response, PageError> {
    control_page(&name, session(&s, &who).resume(&name, Reason { reason: f.reason }).await?)
}

/// Back to the node page, or the agent's refusal as an error page.
fn control_page(node: &str, reply: nightshift_engine::api::ControlReply) -> Result<Response, PageError> {
    if let Some(e) = reply.error {
        return Err(PageError(crate::error::ApiError::new(
            StatusCode::CONFLICT,
            "refused",
            format!("{node}: the agent refused: {}", e.message),
        )));
    }
    Ok(Redirect::to(&format!("/nodes/{node}")).into_response())
}

#[derive(Debug, Deserialize)]
pub struct CancelForm {
    /// Why, when given (an empty field is none).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The run page's cancel button (operator).
pub async fn ui_cancel(
    State(s): State<AppState>,
    Operator(who): Operator,
    Path(run): Path<String>,
    Form(f): Form<CancelForm>,
) -> Result<Response, PageError> {
    session(&s, &who).cancel(&run, Cancel { reason: f.reason }).await?;
    Ok(Redirect::to(&format!("/runs/{run}")).into_response())
}

pub async fn ui_hands_off(
    State(s): State<AppState>,
    Admin(who): Admin,
    Path(name): Path<String>,
    Form(f): Form<HandsOffForm>,
) -> Result<Response, PageError> {
    session(&s, &who).hands_off(&name, HandsOff { hands_off: f.hands_off, reason: f.reason, for_secs: None }).await?;
    Ok(Redirect::to(&format!("/nodes/{name}")).into_response())
}

/// Static assets, embedded in the binary.
pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.css" => {
            ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("assets/app.css")).into_response()
        }
        "app.js" => {
            ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("assets/app.js")).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// The node page's health: each GPU a fault touched, where its lifecycle
/// stands (seconds from the fault to each phase), what a person should do,
/// and its last lifecycles.
fn health_section(h: &NodeHealth) -> Markup {
    let gpus: Vec<&GpuHealthView> =
        h.gpus.iter().filter(|g| g.state != HealthState::Healthy || !g.history.is_empty()).collect();
    let secs = |v: Option<f64>| v.map(|x| format!("{x:.0} s")).unwrap_or_else(|| "—".into());
    html! {
        section #health {
            h2 { "Health" }
            @if gpus.is_empty() {
                p.muted { "every GPU healthy: no fault seen" }
            } @else {
                table {
                    thead { tr { th { "GPU" } th { "State" } th { "Fault" } th { "Quarantined" } th { "Requeued" } th { "Repaired" } th { "Verified" } th { "What to do" } } }
                    tbody {
                        @for g in &gpus {
                            @let phases = g.lifecycle.as_ref().map(|l| l.phases).unwrap_or_default();
                            tr {
                                td { (g.gpu) }
                                td { span.badge.(if g.state == HealthState::Healthy { "ok" } else { "bad" }) { (g.state.as_str()) } }
                                td { (g.fault.as_ref().map(|f| f.detail.as_str()).unwrap_or("")) @if let Some(r) = &g.run { " " a href={"/runs/" (r)} { (r) } } }
                                td.num { (secs(phases.quarantined)) }
                                td.num { (secs(phases.requeued)) }
                                td.num { (secs(phases.repaired)) }
                                td.num { (secs(phases.verified)) }
                                td { (g.instruction.as_deref().unwrap_or("")) @for f in &g.check_failures { br; small.error { (f) } } }
                            }
                            @for past in &g.history {
                                tr.muted {
                                    td {} td { "earlier: " (past.kind.as_str()) } td {}
                                    td.num { (secs(past.phases.quarantined)) }
                                    td.num { (secs(past.phases.requeued)) }
                                    td.num { (secs(past.phases.repaired)) }
                                    td.num { (secs(past.phases.verified)) }
                                    td {}
                                }
                            }
                        }
                    }
                }
                p.muted { "seconds from the fault being seen to each phase of its repair" }
            }
        }
    }
}

#[cfg(test)]
mod sentence_tests {
    use super::step_sentence;
    use serde_json::json;

    #[test]
    fn results_read_as_sentences() {
        let cases = [
            (
                json!({"before": {"power_limit_watts": 700.0}, "after": {"power_limit_watts": 500.0}, "held": true}),
                "power limit 700 W → 500 W (held until the run releases it)",
            ),
            (
                json!({"after": {"released": ["h1"], "settings": [{"detail": "GPU 2 power limit back to its baseline (700 W)"}]}}),
                "GPU 2 power limit back to its baseline (700 W)",
            ),
            (json!({"before": {"fan_pct": 60}, "after": {"fan_pct": 60}}), "fan stays 60 %"),
            (
                json!({"before": {"drained": false}, "after": {"drained": true, "reason": "dbe"}}),
                "drained off → on; reason dbe",
            ),
            (json!({"ok": false}), ""),
        ];
        for (d, want) in cases {
            assert_eq!(step_sentence(&d), want, "{d}");
        }
    }
}
