//! A person's controls through a running engine: `nightshift holds
//! release`, `nightshift nodes resume`, `nightshift nodes hands-off`,
//! `nightshift runs cancel`. Each goes to the engine's API (it sends the
//! change to the agent as `person:<you>`, audited); none needs the engine's
//! key, and none starts an engine of its own beside the running one.

use anyhow::Result;
use serde_json::Value;

use nightshift_engine::api::{
    AgentHolds, Cancel, Cancelled, ControlReply, EngineApi, HandsOff, HandsOffReply, NodeHealth, Reason, ReleaseHolds,
};

use crate::args::Cli;
use crate::cmd::{conn_announced, usage};
use crate::conn::Conn;
use crate::out::Out;
use crate::remote::{Remote, fail};

fn remote<'a>(c: &'a Conn, what: &str) -> Result<&'a Remote> {
    match c {
        Conn::Remote(r) => Ok(r),
        Conn::Local(_) => Err(usage(format!(
            "{what} goes through the running engine (it sends the change as you, audited): pass --server URL (or set NIGHTSHIFT_SERVER)"
        ))),
    }
}

/// Print a control's outcome: one line per request, the agent's refusal
/// where it refused. Exit 3 when any was refused.
fn report(out: &Out, v: &ControlReply) -> Result<u8> {
    let done = v.error.is_none();
    if out.json {
        outln!("{}", serde_json::to_string_pretty(v)?);
        return Ok(if done { 0 } else { 3 });
    }
    let node = &v.outcome.node;
    for a in &v.outcome.actions {
        let what = match (a.result.op.as_str(), &a.hold) {
            ("release", Some(h)) => format!(
                "released hold {h} ({}, owner {})",
                a.setting.as_deref().unwrap_or("?"),
                a.owner.as_deref().unwrap_or("?")
            ),
            ("resume", _) => "put back into service".to_string(),
            ("drain", _) => "drained as yours (nightshift never ends it; `nightshift nodes resume` does)".to_string(),
            (op, _) => op.to_string(),
        };
        if a.result.ok {
            let detail = a.result.after.as_ref().map(released_detail).unwrap_or_default();
            outln!("{} {node}: {what}{detail}", out.green("done:"));
        } else {
            outln!(
                "{} {node}: not {what}: {} ({})",
                out.red("refused:"),
                a.result.error.as_deref().unwrap_or("?"),
                a.result.code.as_deref().unwrap_or("?")
            );
        }
        if let Some(w) = &a.warning {
            outln!("{} {w}", out.yellow("note:"));
        }
    }
    outln!("{}", out.dim("(audited as you: nightshift audit list --node NODE)"));
    Ok(if done { 0 } else { 3 })
}

/// What the agent says a release left, in words.
fn released_detail(after: &Value) -> String {
    let words = released_words(after);
    if words.is_empty() { String::new() } else { format!(" — {}", words.join("; ")) }
}

/// Each setting a release gave back, as the agent words it (its answer's
/// `settings`, or `released.settings`).
pub fn released_words(after: &Value) -> Vec<String> {
    // A release answers a `ReleaseResult` (`settings`); a change that
    // released holds on its way (a resume) an outcome with `released`.
    #[derive(serde::Deserialize, Default)]
    struct Answer {
        #[serde(default)]
        settings: Vec<Setting>,
        #[serde(default)]
        released: Value,
    }
    #[derive(serde::Deserialize, Default)]
    struct Setting {
        #[serde(default)]
        detail: Option<String>,
    }
    let a: Answer = serde_json::from_value(after.clone()).unwrap_or_default();
    let inner: Answer = serde_json::from_value(a.released).unwrap_or_default();
    let settings = if inner.settings.is_empty() { a.settings } else { inner.settings };
    settings.into_iter().filter_map(|s| s.detail).collect()
}

/// Which holds `holds release` was asked to release.
pub struct Release<'a> {
    pub gpu: Option<u32>,
    pub owner: Option<&'a str>,
    pub hold: Option<&'a str>,
    /// Only holds of this kind.
    pub kind: Option<&'a str>,
    /// Every hold on the node, without asking.
    pub all: bool,
    /// Admin: a repair drain of a broken GPU too.
    pub force: bool,
}

pub async fn holds_release(cli: &Cli, out: &Out, node: &str, what: Release<'_>, reason: &str) -> Result<u8> {
    let Release { gpu, owner, hold, kind, all, force } = what;
    let c = conn_announced(cli, out)?;
    let r = remote(&c, "releasing a hold")?;
    // Every hold on a node is a lot to give back by a slip of the keyboard:
    // say what goes and ask, or take --all.
    if gpu.is_none() && owner.is_none() && hold.is_none() && kind.is_none() && !all {
        let held: AgentHolds = r.holds(node).await.map_err(fail)?;
        let holds: Vec<&nightshift_proto::HoldInfo> = held.settings.iter().flat_map(|s| &s.holds).collect();
        if holds.is_empty() {
            outln!("{node}: nothing is held; nothing to release");
            return Ok(0);
        }
        for h in &holds {
            eprintln!("  {}: {} held by {}", h.id, h.value, h.owner);
        }
        let question = format!("release all {} hold(s) on {node} listed above?", holds.len());
        if !ask(&question)? {
            return Err(anyhow::Error::new(crate::Fail(3)).context(format!(
                "nothing released: expected a yes, or --all to release every hold on {node} (or --gpu, --owner, --hold for fewer)"
            )));
        }
    }
    let v = r
        .release(
            node,
            ReleaseHolds {
                gpu,
                owner: owner.map(str::to_string),
                hold: hold.map(str::to_string),
                kind: kind.map(str::to_string),
                all: gpu.is_none() && owner.is_none() && hold.is_none() && kind.is_none(),
                force,
                reason: reason.to_string(),
            },
        )
        .await
        .map_err(fail)?;
    report(out, &v)
}

pub async fn nodes_resume(cli: &Cli, out: &Out, node: &str, reason: &str, yes: bool) -> Result<u8> {
    let c = conn_announced(cli, out)?;
    let r = remote(&c, "putting a node back into service")?;
    // A GPU the repair lifecycle does not hold healthy goes back to work
    // with the node: say which, and ask (or take --yes).
    if !yes {
        let h: NodeHealth = r.node_health(node).await.map_err(fail)?;
        let unhealthy: Vec<String> =
            h.unhealthy().map(|g| format!("GPU {} {}: {}", g.gpu, g.state.as_str(), g.why)).collect();
        if !unhealthy.is_empty() {
            eprintln!("{node} has GPUs the repair lifecycle does not hold healthy:");
            for u in &unhealthy {
                eprintln!("  {u}");
            }
            eprintln!("(`nightshift nodes repaired {node}` lets the health check decide instead)");
            if !ask(&format!("put {node} back into service anyway?"))? {
                return Err(anyhow::Error::new(crate::Fail(3)).context(format!(
                    "nothing done: expected a yes, or --yes to put {node} back into service with {} GPU(s) not healthy",
                    unhealthy.len()
                )));
            }
        }
    }
    let v = r.resume(node, Reason { reason: reason.to_string() }).await.map_err(fail)?;
    report(out, &v)
}

pub async fn nodes_drain(cli: &Cli, out: &Out, node: &str, reason: &str) -> Result<u8> {
    let c = conn_announced(cli, out)?;
    let r = remote(&c, "draining a node")?;
    let v = r.drain(node, Reason { reason: reason.to_string() }).await.map_err(fail)?;
    report(out, &v)
}

pub async fn nodes_hands_off(
    cli: &Cli,
    out: &Out,
    node: &str,
    on: bool,
    reason: Option<&str>,
    for_secs: Option<u64>,
) -> Result<u8> {
    let c = conn_announced(cli, out)?;
    let r = remote(&c, "setting hands-off")?;
    let v: HandsOffReply = r
        .hands_off(node, HandsOff { hands_off: on, reason: reason.map(str::to_string), for_secs })
        .await
        .map_err(fail)?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if on && let Some(until) = v.until_ms {
        outln!(
            "{node}: hands-off — nightshift changes nothing on it until {} (or `nightshift nodes hands-off {node} --off`)",
            nightshift_engine::api::format_rfc3339_ms(until)
        );
    } else if on {
        outln!("{node}: hands-off — nightshift changes nothing on it until `nightshift nodes hands-off {node} --off`");
    } else {
        outln!("{node}: hands-off cleared — nightshift may act on it again");
    }
    Ok(0)
}

pub async fn runs_cancel(cli: &Cli, out: &Out, run: &str, reason: Option<&str>) -> Result<u8> {
    let c = conn_announced(cli, out)?;
    let r = remote(&c, "cancelling a run")?;
    let v: Cancelled = r.cancel(run, Cancel { reason: reason.map(str::to_string) }).await.map_err(fail)?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!("{run}: cancelled — a running run stops at its next step and gives back its holds");
    }
    Ok(0)
}

/// Ask a yes/no question on the terminal; no terminal is a no.
fn ask(question: &str) -> Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}
