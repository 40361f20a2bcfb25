//! `nightshift maintenance list|add|end`: maintenance windows, like
//! Alertmanager's silences, through the engine's `/api/v1/maintenance`.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::{Value, json};

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
            let windows = v["windows"].as_array().cloned().unwrap_or_default();
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
            let mut body = json!({"matchers": labels, "nodes": nodes, "reason": reason});
            if let Some(f) = from {
                body["starts_at"] = json!(at(f)?);
            }
            match (for_span, until) {
                (Some(s), _) => body["for_secs"] = json!(parse_span_secs("--for", s)?),
                (None, Some(u)) => body["ends_at"] = json!(u),
                (None, None) => return Err(usage("pass --for SPAN or --until TIME: a maintenance window always ends")),
            }
            let mut c = crate::cmd::conn_announced(cli, out)?;
            let v = c.change_window(None, &body).await?;
            if out.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            let w = &v["window"];
            let covers = w["covers"].as_array().map_or(0, Vec::len);
            outln!(
                "set maintenance window {} until {}: {} node(s) covered now{}",
                clean(w["id"].as_str().unwrap_or("?")),
                time(&w["ends_ms"]),
                covers,
                if covers == 0 { " (it matches no node yet; a node that comes to match is covered)" } else { "" }
            );
            Ok(0)
        }
        MaintenanceCmd::End { id, reason } => {
            let mut c = crate::cmd::conn_announced(cli, out)?;
            let v = c.change_window(Some(id), &json!({"reason": reason})).await?;
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

fn time(v: &Value) -> String {
    v.as_i64().map(nightshift_engine::api::format_rfc3339_ms).unwrap_or_else(|| "?".into())
}

fn row(out: &Out, w: &Value) -> Vec<String> {
    let mut what: Vec<String> = w["matchers"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
        .unwrap_or_default();
    let nodes: Vec<&str> = w["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !nodes.is_empty() {
        what.push(format!("node {}", nodes.join(",")));
    }
    let covers: Vec<&str> = w["covers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let covering = match covers.len() {
        0 => out.dim("none now"),
        n if n <= 3 => covers.join(","),
        n => format!("{n} nodes"),
    };
    vec![
        clean(w["id"].as_str().unwrap_or("?")),
        clean(&what.join(" ")),
        time(&w["starts_ms"]),
        time(&w["ends_ms"]),
        covering,
        clean(w["by"].as_str().unwrap_or("?")),
        clean(w["reason"].as_str().unwrap_or("")),
    ]
}
