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
