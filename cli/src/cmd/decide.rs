//! `nightshift approve RUN` and `nightshift reject RUN --reason …`.

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::conn_announced;
use crate::out::Out;

/// Approve a run waiting for approval.
pub async fn approve(cli: &Cli, out: &Out, run: &str) -> Result<u8> {
    let mut c = conn_announced(cli, out)?;
    let s = c.decide(run, true, None).await?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        outln!("approved {} ({} on {}): it starts now", s.id, s.runbook, s.target);
    }
    Ok(0)
}

/// Reject a run waiting for approval, saying why.
pub async fn reject(cli: &Cli, out: &Out, run: &str, reason: &str) -> Result<u8> {
    let mut c = conn_announced(cli, out)?;
    let s = c.decide(run, false, Some(reason)).await?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        outln!("rejected {} ({} on {})", s.id, s.runbook, s.target);
    }
    Ok(0)
}

/// Make a running engine read fleet.yaml, tokens and runbooks again; say
/// what changed.
/// `nightshift ha`: an engine's place in its shard, and every shard.
pub async fn ha(cli: &Cli, out: &Out) -> Result<u8> {
    let c = conn_announced(cli, out)?;
    let v = c.ha().await?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let st = &v.status;
    if st.backend == "sled" {
        outln!("sled backend: one engine, no leader election (audit.backend: postgres for HA)");
        return Ok(0);
    }
    let dash = |x: &Option<String>| x.clone().unwrap_or_else(|| "-".into());
    outln!(
        "this engine: {} of shard {} ({}){}",
        st.role,
        dash(&st.shard),
        dash(&st.holder),
        st.term.map(|t| format!(", term {t}")).unwrap_or_default()
    );
    if let Some(why) = &st.deposed {
        outln!("deposed: {why}");
    }
    if let Some(e) = &v.shards_error {
        outln!("shards: cannot read them: {e}");
    }
    let shards = v.shards.clone().unwrap_or_default();
    let rows: Vec<Vec<String>> = shards
        .iter()
        .map(|r| {
            let left = r.expires_in_ms;
            vec![
                r.shard.clone(),
                if left > 0 { r.holder.clone() } else { out.red("none (expired)") },
                r.term.to_string(),
                if left > 0 { format!("{:.1} s", left as f64 / 1000.0) } else { "-".into() },
                r.head_seq.to_string(),
                r.url.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.table(&["SHARD", "LEADER", "TERM", "LEASE LEFT", "RECORDS", "URL"], &rows);
    }
    // Every engine of every shard, leader and standbys, as each announced itself.
    let leaders: Vec<(&str, &str)> =
        shards.iter().filter(|r| r.expires_in_ms > 0).map(|r| (r.shard.as_str(), r.holder.as_str())).collect();
    let engines: Vec<Vec<String>> = v
        .engines
        .iter()
        .flatten()
        .map(|e| {
            let holds = leaders.iter().any(|(s, h)| *s == e.shard && *h == e.holder);
            let ago = e.seen_ms_ago;
            vec![
                e.shard.clone(),
                e.holder.clone(),
                match (e.role.as_str(), holds) {
                    ("leader", true) => out.green("leader"),
                    ("leader", false) => out.yellow("leader (lease lost)"),
                    ("standby", _) => "standby".to_string(),
                    ("stopped", _) => out.dim("stopped"),
                    (r, _) => out.yellow(r),
                },
                Some(e.term).filter(|t| *t > 0).map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                if ago > 15_000 {
                    out.red(&format!("{} s ago", ago / 1000))
                } else {
                    format!("{:.1} s ago", ago as f64 / 1000.0)
                },
                e.url.clone(),
            ]
        })
        .collect();
    if let Some(e) = &v.engines_error {
        outln!("engines: cannot read them: {e}");
    }
    if !engines.is_empty() {
        outln!();
        out.table(&["SHARD", "ENGINE", "ROLE", "TERM", "SEEN", "URL"], &engines);
    }
    Ok(0)
}

pub async fn reload(cli: &Cli, out: &Out, allow_partial: bool) -> Result<u8> {
    let mut c = conn_announced(cli, out)?;
    let r = c.reload(allow_partial).await?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    let list = |v: &[String]| -> String { if v.is_empty() { "none".into() } else { v.join(", ") } };
    let r = &r.report;
    outln!(
        "reloaded: nodes added {}, changed {}, removed {}",
        list(&r.nodes.added),
        list(&r.nodes.changed),
        list(&r.nodes.removed)
    );
    outln!(
        "tokens added {}, changed {}, removed {}{}",
        list(&r.tokens_added),
        list(&r.tokens_changed),
        list(&r.tokens_removed),
        if r.webhook_tokens_changed { "; webhook tokens changed" } else { "" }
    );
    outln!(
        "runbooks: {} loaded{}",
        r.runbooks,
        if r.runbooks_changed { " (changed: trigger states start over)" } else { ", unchanged" }
    );
    for e in &r.runbook_errors {
        outln!("  not loaded: {e}");
    }
    for c in &r.fault_policy {
        outln!("  XID policy: {c}");
    }
    if !r.restart_needed.is_empty() {
        outln!("changed in engine.yaml but in force only after a restart: {}", list(&r.restart_needed));
    }
    Ok(0)
}
