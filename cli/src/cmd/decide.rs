//! `nightshift approve RUN` and `nightshift reject RUN --reason …`.

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::conn;
use crate::out::Out;

/// Approve a run waiting for approval.
pub async fn approve(cli: &Cli, out: &Out, run: &str) -> Result<u8> {
    let mut c = conn(cli, out)?;
    let s = c.decide(run, true, None).await?;
    if out.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("approved {} ({} on {}): it starts now", s.id, s.runbook, s.target);
    }
    Ok(0)
}

/// Reject a run waiting for approval, saying why.
pub async fn reject(cli: &Cli, out: &Out, run: &str, reason: &str) -> Result<u8> {
    let mut c = conn(cli, out)?;
    let s = c.decide(run, false, Some(reason)).await?;
    if out.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("rejected {} ({} on {})", s.id, s.runbook, s.target);
    }
    Ok(0)
}
