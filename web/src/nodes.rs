//! The fleet's nodes at a glance: `/nodes` (every node, filtered by label
//! and state, sorted, grouped by a label, with its health), `/fleet` (the
//! counts by health, GPU model and pool) — and the cells the node page
//! shares with them.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use nightshift_engine::api::HealthState;
use nightshift_engine::api::NodeView;

use crate::AppState;
use crate::extract::Viewer;
use crate::html::{PageError, layout, urlencode};

/// The agent cell: connected, unreachable — or, on an HA standby (which
/// talks to no agent), whose agents they are.
pub(crate) fn agent_cell(connected: bool, standby_of: Option<&str>) -> Markup {
    html! {
        @if connected { span.badge.ok { "connected" } }
        @else if let Some(leader) = standby_of { span.badge.muted title="an HA standby connects to no agent: the leader does" { "the leader's (" (leader) ")" } }
        @else { span.badge.bad { "unreachable" } }
    }
}

/// On an HA standby: the leader's name (its agents are the leader's).
pub(crate) fn standby_of(s: &AppState) -> Option<String> {
    let ha = s.engine.ha_status();
    (ha.role == "standby").then(|| ha.leader.map(|l| l.holder).unwrap_or_else(|| "none yet".into()))
}

/// How `/nodes` may be sorted (`?sort=`): by name, worst health first,
/// hottest GPU first, or drained first.
const SORTS: [&str; 4] = ["name", "health", "temp", "drain"];

/// One row of `/nodes`.
struct Row<'a> {
    n: &'a NodeView,
    health: HealthState,
    hottest: Option<f64>,
}

/// `/nodes`: every node (or those a label and state select), sorted
/// (`sort=name|health|temp|drain`) and grouped by a label (`group=pool`),
/// with its agent, drain, health in the repair lifecycle and hottest GPU.
/// Built for a fleet of thousands: one pass over the nodes, no script.
pub async fn nodes_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Response, PageError> {
    use nightshift_engine::api::{EngineApi, FleetModeView, NodeStateFilter, NodesQuery};
    let nodes = s.engine.nodes();
    // The table shows what the filter selects; the counts are the fleet's.
    let nonempty = |k: &str| q.get(k).filter(|v| !v.is_empty());
    let (label, state, group) = (nonempty("label"), nonempty("state"), nonempty("group"));
    let sort = nonempty("sort").map(String::as_str).unwrap_or("name");
    let bad = |e: String| PageError(crate::error::ApiError::bad_request(e));
    if !SORTS.contains(&sort) {
        return Err(bad(format!("sort: expected one of {}, found {sort:?}", SORTS.join(", "))));
    }
    let shown = if label.is_none() && state.is_none() {
        nodes.clone()
    } else {
        let query = NodesQuery { label: label.cloned(), state: state.cloned(), ..Default::default() };
        crate::api::session(&s, &who).nodes(query).await.map_err(|e| PageError(e.into()))?.nodes
    };
    let model = s.engine.health_model();
    let mut rows: Vec<Row<'_>> = shown
        .iter()
        .map(|n| Row {
            n,
            health: model.node_state(&n.name),
            hottest: n
                .gpus
                .iter()
                .filter_map(|g| g.get("gpu.temperature_c"))
                .cloned()
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x)))),
        })
        .collect();
    match sort {
        "health" => rows.sort_by_key(|r| std::cmp::Reverse(r.health.rank())),
        "temp" => rows.sort_by(|a, b| b.hottest.unwrap_or(f64::MIN).total_cmp(&a.hottest.unwrap_or(f64::MIN))),
        "drain" => rows.sort_by_key(|r| !r.n.state.drained),
        _ => {}
    }
    // Grouped by a label's value (stable: the sort holds within a group).
    let mut groups: Vec<(String, Vec<Row<'_>>)> = Vec::new();
    match group {
        Some(key) => {
            let mut by: std::collections::BTreeMap<String, Vec<Row<'_>>> = Default::default();
            for r in rows {
                let v = r.n.labels.get(key).map(|v| format!("{key}={v}")).unwrap_or_else(|| format!("no {key}"));
                by.entry(v).or_default().push(r);
            }
            groups.extend(by);
            // Worst first, the groups too: the pool with the sickest node
            // leads (by name among equals).
            if sort == "health" {
                groups.sort_by_key(|(_, rows)| std::cmp::Reverse(rows.iter().map(|r| r.health.rank()).max()));
            }
        }
        None => groups.push((String::new(), rows)),
    }
    let standby = standby_of(&s);
    let serving = nodes.iter().filter(|n| !n.standby).count();
    let by_people = nodes.iter().filter(|n| !n.standby && n.state.drained && n.drained_by_person).count();
    let by_us = nodes.iter().filter(|n| !n.standby && n.state.drained && !n.drained_by_person).count();
    let FleetModeView { mode, set_by, reason, .. } =
        crate::api::session(&s, &who).fleet_mode().await.map_err(|e| PageError(e.into()))?;
    let set_by = set_by.map(|by| (by, reason));
    // A link to this view sorted another way (the filter and grouping kept).
    let link = |sort_by: &str| {
        let mut url = format!("/nodes?sort={sort_by}");
        for (k, v) in [("label", label), ("state", state), ("group", group)] {
            if let Some(v) = v {
                url.push_str(&format!("&{k}={}", urlencode(v)));
            }
        }
        url
    };
    let th_sort = |title: &str, by: &str| {
        html! { th { @if sort == by { (title) " ▾" } @else { a href=(link(by)) { (title) } } } }
    };
    let body = html! {
        h1 { "Nodes" }
        @if mode != nightshift_engine::api::FleetMode::Act {
            p.fleet-mode { span.badge.warn { "fleet " (mode.as_str()) } " "
                @match &set_by {
                    Some((by, why)) => { "set by " (by) ": " (why) }
                    None => { "initial_fleet_mode in engine.yaml" }
                }
                @if mode == nightshift_engine::api::FleetMode::Shadow { " — every automatic run is a dry run" }
                @else { " — no automatic run starts" }
            }
        }
        @if let Some(leader) = &standby {
            p.counts { "This engine is an HA standby: it reads no agent, so drains and readings are the leader's (" (leader) ") — its own nodes page has them. Health in the repair lifecycle is read from the shared audit log. · " a href="/fleet" { "the fleet by health and GPU model" } }
        } @else {
            p.counts {
                (serving) " serving nodes: " (serving - by_people - by_us) " in service, "
                (by_us) " drained by nightshift (the blast radius counts these), "
                (by_people) " drained by people (not counted) · " a href="/fleet" { "the fleet by health and GPU model" }
            }
        }
        form.filter method="get" action="/nodes" {
            input type="text" name="label" placeholder="label key=value (pool=train)" value=(label.cloned().unwrap_or_default());
            " "
            select name="state" {
                option value="" { "any state" }
                @for (name, _) in NodeStateFilter::ALL {
                    option value=(name) selected[state.map(String::as_str) == Some(name)] { (name.replace('_', " ")) }
                }
            }
            " "
            input type="text" name="group" placeholder="group by label (pool, rack)" value=(group.cloned().unwrap_or_default());
            input type="hidden" name="sort" value=(sort);
            " "
            button type="submit" { "Show" }
            @if label.is_some() || state.is_some() || group.is_some() { " " (shown.len()) " of " (nodes.len()) " nodes · " a href="/nodes" { "all" } }
        }
        div.scroll {
            table.nodes {
                thead { tr {
                    (th_sort("Node", "name")) th { "Labels" } th { "Agent" } (th_sort("Drain", "drain"))
                    (th_sort("Health", "health")) (th_sort("Hottest GPU", "temp")) th { "Notes" }
                } }
                tbody {
                    @for (name, rows) in &groups {
                        @if !name.is_empty() {
                            tr.group { td colspan="7" {
                                strong { (name) } " · " (rows.len()) " node(s)"
                                @let sick = rows.iter().filter(|r| r.health != HealthState::Healthy).count();
                                @if sick > 0 { " · " span.badge.bad { (sick) " not healthy" } }
                                @let drained = rows.iter().filter(|r| r.n.state.drained).count();
                                @if drained > 0 { " · " (drained) " drained" }
                            } }
                        }
                        @for r in rows {
                            @let n = r.n;
                            tr {
                                td { a href={"/nodes/" (n.name)} { (n.name) } @if n.standby { " " span.tag { "standby" } } }
                                td { @for (k, v) in &n.labels { span.tag { (k) "=" (v) } " " } }
                                td { (agent_cell(n.state.connected, standby.as_deref())) }
                                td { (drain_cell(&n.state.drained, &n.state.drain_reason, n.drained_by_person, standby.as_deref())) @if n.state.hands_off() { " " span.badge.warn { "hands-off" } } }
                                td { (health_cell(r.health)) }
                                td.num { (r.hottest.map(|t| format!("{t:.1} °C")).unwrap_or_else(|| "—".into())) }
                                td { @for (k, v) in &n.state.annotations { span.tag title=(v) { (k) } " " } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(layout("Nodes", "Nodes", Some(&who), body).into_response())
}

/// A health state in the repair lifecycle, as a badge.
pub(crate) fn health_cell(h: HealthState) -> Markup {
    let class = match h {
        HealthState::Healthy => "muted",
        HealthState::Verifying => "running",
        HealthState::AwaitingRepair | HealthState::Rma => "warn",
        HealthState::Faulted | HealthState::Quarantined => "bad",
    };
    html! { span class={"badge " (class)} { (h.as_str().replace('_', " ")) } }
}

/// The drain cell: drained (by whom, why) or in service — or, on an HA
/// standby (which reads no agent, so knows no drain), whose it is to say.
pub(crate) fn drain_cell(drained: &bool, reason: &Option<String>, by_person: bool, standby_of: Option<&str>) -> Markup {
    html! {
        @if let Some(leader) = standby_of {
            span.badge.muted title="an HA standby reads no agent: the leader knows each node's drain" { "the leader's (" (leader) ")" }
        } @else if *drained {
            span class={"badge " (if by_person { "warn" } else { "running" })} { @if by_person { "drained by a person" } @else { "drained by nightshift" } }
            @if let Some(r) = reason { " " small { (r) } }
        } @else { span.muted { "in service" } }
    }
}

/// What `/fleet` counts for one slice of the fleet (a pool, a GPU model).
#[derive(Default)]
struct Tally {
    nodes: usize,
    gpus: usize,
    gpus_not_healthy: usize,
    drained_by_us: usize,
    drained_by_people: usize,
    hands_off: usize,
}

/// `/fleet`: the whole fleet in counts — nodes and GPUs by health in the
/// repair lifecycle, GPUs by model, nodes by pool with their drains — each
/// a link to the nodes behind it.
pub async fn fleet_page(State(s): State<AppState>, Viewer(who): Viewer) -> Result<Response, PageError> {
    use std::collections::BTreeMap;
    let nodes = s.engine.nodes();
    let model = s.engine.health_model();
    let mut node_health: BTreeMap<&str, usize> = HealthState::ALL.iter().map(|h| (h.as_str(), 0)).collect();
    let mut gpu_health: BTreeMap<&str, usize> = node_health.clone();
    let mut by_model: BTreeMap<String, Tally> = BTreeMap::new();
    let mut by_pool: BTreeMap<String, Tally> = BTreeMap::new();
    for n in &nodes {
        *node_health.entry(model.node_state(&n.name).as_str()).or_default() += 1;
        let sick: BTreeMap<u32, HealthState> = model
            .node_gpus(&n.name)
            .filter(|(_, h)| h.state != HealthState::Healthy)
            .map(|(g, h)| (g, h.state))
            .collect();
        let count = n.state.gpu_count().max(sick.keys().map(|g| *g as usize + 1).max().unwrap_or(0));
        for h in sick.values() {
            *gpu_health.entry(h.as_str()).or_default() += 1;
        }
        *gpu_health.entry("healthy").or_default() += count.saturating_sub(sick.len());
        let names: Vec<String> = match &n.state.inventory {
            Some(inv) => inv.gpus.iter().map(|g| g.name.clone()).collect(),
            None => vec!["not reported yet".to_string(); count],
        };
        for (i, name) in names.iter().enumerate() {
            let t = by_model.entry(name.clone()).or_default();
            t.gpus += 1;
            t.gpus_not_healthy += usize::from(sick.contains_key(&(i as u32)));
        }
        let pool = n.labels.get("pool").cloned().unwrap_or_else(|| "no pool".into());
        let t = by_pool.entry(if n.standby { format!("{pool} (standby)") } else { pool }).or_default();
        t.nodes += 1;
        t.gpus += count;
        t.gpus_not_healthy += sick.len();
        t.drained_by_us += usize::from(n.state.drained && !n.drained_by_person);
        t.drained_by_people += usize::from(n.state.drained && n.drained_by_person);
        t.hands_off += usize::from(n.state.hands_off());
    }
    let total_gpus: usize = gpu_health.values().sum();
    use nightshift_engine::api::EngineApi;
    let api = crate::api::session(&s, &who);
    let mode = api.fleet_mode().await.map_err(|e| PageError(e.into()))?.mode;
    let windows = api.windows().await.map_err(|e| PageError(e.into()))?.windows;
    let standby = standby_of(&s);
    let body = html! {
        h1 { "Fleet" }
        @if let Some(leader) = &standby {
            p.counts { "This engine is an HA standby: health is read from the shared audit log; drains and hands-off are the leader's (" (leader) ") to count — its fleet page has them." }
        }
        p.counts {
            (nodes.len()) " nodes, " (total_gpus) " GPUs · the fleet is in " strong { (mode.as_str()) } " mode · "
            a href="/nodes?sort=health" { "nodes, worst first" }
        }
        h2 { "Maintenance windows" }
        @if windows.is_empty() {
            p.muted { "None in force or to come (" code { "nightshift maintenance add" } ")." }
        } @else {
            div.scroll { table {
                thead { tr { th { "Window" } th { "Matches" } th { "From" } th { "Until" } th.num { "Covers now" } th { "Set by" } th { "Why" } } }
                tbody {
                    @for w in &windows {
                        tr {
                            td { code { (w.id) } }
                            td { @for (k, v) in &w.matchers { span.tag { (k) "=" (v) } " " } @for n in &w.nodes { a href={"/nodes/" (urlencode(n))} { (n) } " " } }
                            td { (nightshift_engine::api::format_rfc3339_ms(w.starts_ms)) }
                            td { (nightshift_engine::api::format_rfc3339_ms(w.ends_ms)) }
                            td.num { (w.covers.len()) }
                            td { (w.by) }
                            td { (w.reason) }
                        }
                    }
                }
            } }
        }
        h2 { "Health in the repair lifecycle" }
        div.scroll { table {
            thead { tr { th { "State" } th.num { "Nodes (worst GPU)" } th.num { "GPUs" } } }
            tbody {
                @for h in HealthState::ALL {
                    tr {
                        td { (health_cell(h)) }
                        td.num { (node_health.get(h.as_str()).copied().unwrap_or(0)) }
                        td.num { (gpu_health.get(h.as_str()).copied().unwrap_or(0)) }
                    }
                }
            }
        } }
        h2 { "GPU models" }
        div.scroll { table {
            thead { tr { th { "Model" } th.num { "GPUs" } th.num { "Not healthy" } } }
            tbody {
                @for (name, t) in &by_model {
                    tr { td { (name) } td.num { (t.gpus) } td.num { (t.gpus_not_healthy) } }
                }
            }
        } }
        h2 { "Pools" }
        div.scroll { table {
            thead { tr {
                th { "Pool" } th.num { "Nodes" } th.num { "GPUs" } th.num { "GPUs not healthy" }
                th.num { "Drained by nightshift" } th.num { "Drained by people" } th.num { "Hands-off" }
            } }
            tbody {
                @for (pool, t) in &by_pool {
                    tr {
                        td { @match pool.strip_suffix(" (standby)").unwrap_or(pool).strip_prefix("no pool") {
                            Some(_) => { (pool) }
                            None => { a href={"/nodes?group=pool&sort=health&label=pool%3D" (urlencode(pool.strip_suffix(" (standby)").unwrap_or(pool)))} { (pool) } }
                        } }
                        td.num { (t.nodes) } td.num { (t.gpus) } td.num { (t.gpus_not_healthy) }
                        td.num { (t.drained_by_us) } td.num { (t.drained_by_people) } td.num { (t.hands_off) }
                    }
                }
            }
        } }
    };
    Ok(layout("Fleet", "Fleet", Some(&who), body).into_response())
}
