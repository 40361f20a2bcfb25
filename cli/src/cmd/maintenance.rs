//! `nightshift maintenance list|add|end`: maintenance windows, like
//! Alertmanager's silences, through the engine's `/api/v1/maintenance`.

use std::collections::BTreeMap;

use anyhow::Result;
use nightshift_engine::api::{NewWindow, Window};

use crate::args::{Cli, MaintenanceCmd};
use crate::cmd::{parse_span_secs, usage};
use crate::out::{Out, clean};

pub async fn maintenance(cli: &Cli, out: &Out, cmd: &MaintenanceCmd) -> Result<u8> {
    match cmd {
        MaintenanceCmd::List => {
            let mut c = crate::cmd::conn(cli, out)?;
            let v = c.windows().await?;
            c.close().await;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            let windows = v.windows;
            if windows.is_empty() {
                outln!("no maintenance window in force or to come");
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = windows.iter().map(|w| row(out, w)).collect();
            out.table(&["ID", "MATCHES", "FROM", "UNTIL", "COVERS", "SET BY", "WHY"], &rows);
            Ok(0)
        }
        MaintenanceCmd::Add { matchers, nodes, from, for_span, until, reason } => {
            let mut labels = BTreeMap::new();
            for m in matchers {
                let Some((k, v)) = m.split_once('=') else {
                    return Err(usage(format!("--match: expected KEY=VALUE (pool=train), found {m:?}")));
                };
                labels.insert(k.trim().to_string(), v.trim().to_string());
            }
            let mut body = NewWindow {
                matchers: labels,
                nodes: nodes.clone(),
                reason: reason.clone(),
                starts_at: from.as_deref().map(at).transpose()?,
                ..NewWindow::default()
            };
            match (for_span, until) {
                (Some(s), _) => body.for_secs = Some(parse_span_secs("--for", s)?),
                (None, Some(u)) => body.ends_at = Some(u.clone()),
                (None, None) => return Err(usage("pass --for SPAN or --until TIME: a maintenance window always ends")),
            }
            let mut c = crate::cmd::conn_announced(cli, out)?;
            let v = c.set_window(body).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            let w = &v.window;
            let covers = w.covers.len();
            outln!(
                "set maintenance window {} until {}: {} node(s) covered now{}",
                clean(&w.id),
                time(w.ends_ms),
                covers,
                if covers == 0 { " (it matches no node yet; a node that comes to match is covered)" } else { "" }
            );
            Ok(0)
        }
        MaintenanceCmd::End { id, reason } => {
            let mut c = crate::cmd::conn_announced(cli, out)?;
            let v = c.end_window(id, reason).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            outln!("ended maintenance window {}: its nodes are nightshift's again", clean(id));
            Ok(0)
        }
    }
}

/// `--from`: an RFC 3339 time as given, or a span from now.
fn at(s: &str) -> Result<String> {
    if nightshift_engine::api::parse_rfc3339_ms(s).is_some() {
        return Ok(s.to_string());
    }
    let secs = parse_span_secs("--from", s)
        .map_err(|_| usage(format!("--from: expected an RFC 3339 time or a span from now (2h), found {s:?}")))?;
    let ms = jiff::Timestamp::now().as_millisecond().saturating_add((secs as i64).saturating_mul(1000));
    Ok(nightshift_engine::api::format_rfc3339_ms(ms))
}

fn time(ms: i64) -> String {
    nightshift_engine::api::format_rfc3339_ms(ms)
}

fn row(out: &Out, w: &Window) -> Vec<String> {
    let mut what: Vec<String> = w.matchers.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !w.nodes.is_empty() {
        what.push(format!("node {}", w.nodes.join(",")));
    }
    let covering = match w.covers.len() {
        0 => out.dim("none now"),
        n if n <= 3 => w.covers.join(","),
        n => format!("{n} nodes"),
    };
    vec![
        clean(&w.id),
        clean(&what.join(" ")),
        time(w.starts_ms),
        time(w.ends_ms),
        covering,
        clean(&w.by),
        clean(&w.reason),
    ]
}
