//! The fleet's nodes at a glance: `/nodes` (every node, filtered by label
//! and state) — and the cells the node page shares with it.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::AppState;
use crate::extract::Viewer;
use crate::html::{PageError, layout};

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

/// `/nodes`.
pub async fn nodes_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Response, PageError> {
    use nightshift_engine::node_filter::{NodeFilter, NodeStateFilter, parse_label};
    let nodes = s.engine.nodes();
    // The table shows what the filter selects; the counts are the fleet's.
    let (label, state) = (q.get("label").filter(|l| !l.is_empty()), q.get("state").filter(|v| !v.is_empty()));
    let bad = |e: String| PageError(crate::error::ApiError::bad_request(e));
    let f = NodeFilter {
        label: label.map(|l| parse_label(l)).transpose().map_err(bad)?,
        state: state.map(|v| NodeStateFilter::parse(v)).transpose().map_err(bad)?,
        ..Default::default()
    };
    let shown = if f == NodeFilter::default() { nodes.clone() } else { s.engine.nodes_filtered(&f).0 };
    let standby = standby_of(&s);
    let serving = nodes.iter().filter(|n| !n.standby).count();
    let by_people = nodes.iter().filter(|n| !n.standby && n.state.drained && n.drained_by_person).count();
    let by_us = nodes.iter().filter(|n| !n.standby && n.state.drained && !n.drained_by_person).count();
    let (mode, set_by) = s.engine.fleet_mode();
    let body = html! {
        h1 { "Nodes" }
        @if mode != nightshift_engine::modes::FleetMode::Act {
            p.fleet-mode { span.badge.warn { "fleet " (mode.as_str()) } " "
                @match &set_by {
                    Some((by, why)) => { "set by " (by) ": " (why) }
                    None => { "initial_fleet_mode in engine.yaml" }
                }
                @if mode == nightshift_engine::modes::FleetMode::Shadow { " — every automatic run is a dry run" }
                @else { " — no automatic run starts" }
            }
        }
        p.counts {
            (serving) " serving nodes: " (serving - by_people - by_us) " in service, "
            (by_us) " drained by nightshift (the blast radius counts these), "
            (by_people) " drained by people (not counted)"
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
            button type="submit" { "Filter" }
            @if f != NodeFilter::default() { " " (shown.len()) " of " (nodes.len()) " nodes · " a href="/nodes" { "all" } }
        }
        div.scroll {
            table {
                thead { tr { th { "Node" } th { "Labels" } th { "Agent" } th { "Drain" } th { "Hottest GPU" } th { "Notes" } } }
                tbody {
                    @for n in &shown {
                        tr {
                            td { a href={"/nodes/" (n.name)} { (n.name) } @if n.standby { " " span.tag { "standby" } } }
                            td { @for (k, v) in &n.labels { span.tag { (k) "=" (v) } " " } }
                            td { (agent_cell(n.state.connected, standby.as_deref())) }
                            td { (drain_cell(&n.state.drained, &n.state.drain_reason, n.drained_by_person)) @if n.state.hands_off() { " " span.badge.warn { "hands-off" } } }
                            td.num { (n.gpus.iter().filter_map(|g| g.get("gpu.temperature_c")).cloned().fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x)))).map(|t| format!("{t:.1} °C")).unwrap_or_else(|| "—".into())) }
                            td { @for (k, v) in &n.state.annotations { span.tag title=(v) { (k) } " " } }
                        }
                    }
                }
            }
        }
    };
    Ok(layout("Nodes", "Nodes", Some(&who), body).into_response())
}

pub(crate) fn drain_cell(drained: &bool, reason: &Option<String>, by_person: bool) -> Markup {
    html! {
        @if *drained {
            span class={"badge " (if by_person { "warn" } else { "running" })} { @if by_person { "drained by a person" } @else { "drained by nightshift" } }
            @if let Some(r) = reason { " " small { (r) } }
        } @else { span.muted { "in service" } }
    }
}
